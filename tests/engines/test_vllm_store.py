"""The folder-backed segment store the connector shares between processes (no vLLM)."""

from __future__ import annotations

from pathlib import Path

import torch

from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.kv.store import MissReason, StoredKV

MB = 1 << 20


def _kv(model: str = "m#1", n: int = 4) -> StoredKV:
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, n, 2, 8, generator=g), torch.randn(2, n, 2, 8, generator=g)
    return StoredKV(keys, values, torch.arange(n), model, "tok#1", "ctx")


def test_a_second_store_on_the_folder_finds_the_entry(tmp_path: Path) -> None:
    FolderSegmentStore(tmp_path, MB).put_content("cid", _kv())
    other = FolderSegmentStore(tmp_path, MB)  # another process, same folder
    assert other.contains_content("m#1", "tok#1", "cid")
    found = other.lookup_content("m#1", "tok#1", "cid")
    assert found.kv is not None and torch.equal(found.kv.keys, _kv().keys)
    assert found.kv.context_id == "ctx" and other.folder_hits == 1
    assert (other.stats.hits, other.stats.misses) == (1, 0)


def test_a_corrupted_file_is_a_checksum_miss_never_served(tmp_path: Path) -> None:
    FolderSegmentStore(tmp_path, MB).put_content("cid", _kv())
    (path,) = [p for p in tmp_path.rglob("*.kv")]
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    other = FolderSegmentStore(tmp_path, MB)
    found = other.lookup_content("m#1", "tok#1", "cid")
    assert found.kv is None and found.miss == MissReason.CHECKSUM
    assert other.checksum_failures == 1


def test_entries_of_another_model_are_not_found(tmp_path: Path) -> None:
    FolderSegmentStore(tmp_path, MB).put_content("cid", _kv("m#1"))
    other = FolderSegmentStore(tmp_path, MB)
    assert not other.contains_content("m#2", "tok#1", "cid")
    assert other.lookup_content("m#2", "tok#1", "cid").kv is None
