"""The folder-backed segment store the connector shares between processes (no vLLM)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
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


def _files(folder: Path, suffix: str) -> list[Path]:
    return sorted(folder.rglob(f"*.{suffix}"))


def test_the_folder_is_evicted_to_its_byte_bound_least_recent_first(tmp_path: Path) -> None:
    writer = FolderSegmentStore(tmp_path, 0)  # nothing in memory: the files only
    cids = ["c0", "c1", "c2", "c3"]
    for cid in cids:
        writer.put_content(cid, _kv())
    entry = sum(p.stat().st_size for p in tmp_path.rglob("*.*")) // 4  # one KV + its meta
    for i, path in enumerate(_kv_paths(tmp_path, cids)):
        os.utime(path, ns=(10**18 + i, 10**18 + i))  # written long ago, in this order
    assert writer.lookup_content("m#1", "tok#1", "c0").kv is not None  # c0 is used again
    bounded = FolderSegmentStore(tmp_path, 0, folder_bytes=5 * entry // 2)
    held = [c for c in [*cids, "c4"] if bounded.contains_content("m#1", "tok#1", c)]
    assert held == ["c0", "c3"] and bounded.folder_evictions == 2  # down to 0.9 x 2.5 entries
    bounded.put_content("c4", _kv())  # 3 entries > 2.5: the writer evicts the oldest
    held = [c for c in [*cids, "c4"] if bounded.contains_content("m#1", "tok#1", c)]
    assert held == ["c0", "c4"] and bounded.folder_evictions == 3
    assert len(_files(tmp_path, "kv")) == len(_files(tmp_path, "meta")) == 2


def _kv_paths(folder: Path, cids: list[str]) -> list[Path]:
    store = FolderSegmentStore(folder, 0)
    return [store._path("m#1", "tok#1", c) for c in cids]


def test_a_meta_file_must_pass_its_checksum_and_describe_its_kv_file(tmp_path: Path) -> None:
    store = FolderSegmentStore(tmp_path, 0)  # nothing in memory: the files only
    store.put_content("a", _kv())
    store.put_content("b", StoredKV(_kv().keys, _kv().values, torch.arange(7, 11), "m#1", "tok#1"))
    meta_a, meta_b = (p.with_suffix(".meta") for p in _kv_paths(tmp_path, ["a", "b"]))
    good = store.meta("m#1", "tok#1", "b")
    assert good is not None and good.positions is not None
    assert good.positions.tolist() == [7, 8, 9, 10]
    meta_b.write_bytes(meta_a.read_bytes())  # a valid meta file, of another entry
    assert store.meta("m#1", "tok#1", "b") is None and store.checksum_failures == 1
    edited = meta_a.read_bytes().replace(b'"start": 0', b'"start": 5')
    meta_a.write_bytes(edited)  # the positions changed, the checksum did not
    assert store.meta("m#1", "tok#1", "a") is None and store.checksum_failures == 2


def _digest_file(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=32).digest() + payload


def _saved(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _entry(**changes: object) -> dict[str, object]:
    kv = _kv()
    meta = {"model_id": "m#1", "tokenizer_id": "tok#1", "context_id": "ctx"}
    obj: dict[str, object] = {"keys": kv.keys, "values": kv.values, "positions": kv.positions}
    return obj | {"meta": meta} | changes


KV_FILES: list[tuple[str, Callable[[bytes], bytes]]] = [
    ("flip-payload", lambda b: b[:-100] + bytes([b[-100] ^ 0xFF]) + b[-99:]),
    ("flip-digest", lambda b: bytes([b[0] ^ 1]) + b[1:]),
    ("truncate", lambda b: b[: len(b) // 2]),
    ("digest-only", lambda b: b[:32]),
    ("empty", lambda b: b""),
    ("random-checksummed", lambda b: _digest_file(bytes(range(256)) * 8)),
    ("list-checksummed", lambda b: _digest_file(_saved([1, 2, 3]))),
    ("no-keys", lambda b: _digest_file(_saved({k: v for k, v in _entry().items() if k != "keys"}))),
    ("keys-list", lambda b: _digest_file(_saved(_entry(keys=[1.0, 2.0])))),
    ("keys-3d", lambda b: _digest_file(_saved(_entry(keys=torch.zeros(2, 4, 16))))),
    ("values-shape", lambda b: _digest_file(_saved(_entry(values=torch.zeros(2, 3, 2, 8))))),
    ("positions-short", lambda b: _digest_file(_saved(_entry(positions=torch.arange(3))))),
    ("meta-list", lambda b: _digest_file(_saved(_entry(meta=["m#1"])))),
    ("meta-ids-int", lambda b: _digest_file(_saved(_entry(meta={"model_id": 1})))),
    ("pickled-object", lambda b: _digest_file(_saved(Path("x")))),
]


@pytest.mark.parametrize("damage", [c[1] for c in KV_FILES], ids=[c[0] for c in KV_FILES])
def test_a_damaged_or_forged_kv_file_is_a_checksum_miss(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    FolderSegmentStore(tmp_path, MB).put_content("cid", _kv())
    (path,) = _files(tmp_path, "kv")
    path.write_bytes(damage(path.read_bytes()))
    reader = FolderSegmentStore(tmp_path, MB)
    found = reader.lookup_content("m#1", "tok#1", "cid")
    assert found.kv is None and found.miss == MissReason.CHECKSUM
    assert reader.checksum_failures == 1 and reader.folder_hits == 0


def test_a_kv_file_replaced_by_a_folder_is_a_miss(tmp_path: Path) -> None:
    FolderSegmentStore(tmp_path, MB).put_content("cid", _kv())
    (path,) = _files(tmp_path, "kv")
    path.unlink()
    path.mkdir()
    reader = FolderSegmentStore(tmp_path, MB)
    assert reader.lookup_content("m#1", "tok#1", "cid").kv is None


META_FILES: list[tuple[str, Callable[[bytes], bytes]]] = [
    ("garbage", lambda b: b"{not json"),
    ("empty", lambda b: b""),
    ("truncated", lambda b: b[: len(b) // 2]),
    ("body-edited", lambda b: b.replace(b'"num_tokens": 4', b'"num_tokens": 5')),
    ("sum-edited", lambda b: (b"0" * 64) + b[64:]),
    ("no-sum", lambda b: b.partition(b" ")[2]),
    ("resummed-other-kv", lambda b: _resum(b, kv_digest="00" * 32)),
    ("resummed-bad-hex", lambda b: _resum(b, kv_digest="zz")),
    ("resummed-positions", lambda b: _resum(b, positions=[1, 2])),
    ("resummed-positions-2d", lambda b: _resum(b, positions=[[1, 2], [3, 4]])),
    ("resummed-start-str", lambda b: _resum(b, start="x")),
    ("resummed-no-context", lambda b: _resum(b, context_id=KeyError)),
    ("resummed-list", lambda b: _checksum(b"[1, 2]")),
]


def _checksum(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=32).hexdigest().encode() + b" " + body


def _resum(raw: bytes, **changes: object) -> bytes:
    """A meta file with fields changed and a checksum that matches them."""
    meta = json.loads(raw.partition(b" ")[2])
    for key, value in changes.items():
        if value is KeyError:
            del meta[key]
        else:
            meta[key] = value
    return _checksum(json.dumps(meta).encode())


@pytest.mark.parametrize("damage", [c[1] for c in META_FILES], ids=[c[0] for c in META_FILES])
def test_a_meta_file_failing_its_checks_is_a_counted_miss(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    FolderSegmentStore(tmp_path, MB).put_content("cid", _kv())
    (meta,) = _files(tmp_path, "meta")
    meta.write_bytes(damage(meta.read_bytes()))
    reader = FolderSegmentStore(tmp_path, 0)
    assert reader.meta("m#1", "tok#1", "cid") is None and reader.checksum_failures == 1
    assert reader.lookup_content("m#1", "tok#1", "cid").kv is not None  # the KV stays good


# ---- retention: pins every process's eviction scan honours ----


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _aged(folder: Path, cids: list[str]) -> int:
    """Write `cids` (oldest first) to `folder`; the bytes of one entry."""
    writer = FolderSegmentStore(folder, 0)
    for cid in cids:
        writer.put_content(cid, _kv())
    for i, path in enumerate(_kv_paths(folder, cids)):
        os.utime(path, ns=(10**18 + i, 10**18 + i))
    return sum(p.stat().st_size for p in folder.rglob("*.*")) // len(cids)


def _held(store: FolderSegmentStore, cids: list[str]) -> list[str]:
    return [c for c in cids if store.contains_content("m#1", "tok#1", c)]


def _retaining(
    folder: Path, bound_entries: int
) -> tuple[list[str], int, Clock, FolderSegmentStore]:
    """Four aged entries and the server's store on them, bounded to `bound_entries` of them."""
    cids = ["c0", "c1", "c2", "c3"]
    entry = _aged(folder, cids)
    clock = Clock()
    store = FolderSegmentStore(folder, 0, folder_bytes=bound_entries * entry, clock=clock)
    return cids, entry, clock, store


def test_a_pinned_entry_outlives_another_processs_eviction_until_its_pin_expires(
    tmp_path: Path,
) -> None:
    cids, entry, clock, server = _retaining(tmp_path, 10)
    server.set_retain_share(0.5)
    got = server.retain("m#1", "tok#1", ["c0", "gone"], 30.0, owner="tenant-a")
    assert len(got.pinned) == 1 and len(got.refused) == 1  # "gone" was never stored
    assert got.nbytes == entry and server.retention_stats().pinned_bytes == entry
    (pin,) = tmp_path.rglob("*.pin")
    assert float(pin.read_text()) == 1030.0
    # a worker's scan (its own process, its own store) with room for two entries
    worker = FolderSegmentStore(tmp_path, 0, folder_bytes=5 * entry // 2, clock=clock)
    assert _held(worker, cids) == ["c0", "c3"]  # the oldest, c0, was passed over
    clock.now = 1030.0  # the pin expired: protects nothing
    worker.put_content("c4", _kv())
    assert _held(worker, [*cids, "c4"]) == ["c3", "c4"]
    assert not list(tmp_path.rglob("*.pin"))  # deleted with its entry


def test_pins_stay_within_the_share_and_a_tenants_part_and_release_unpins(
    tmp_path: Path,
) -> None:
    cids, entry, clock, server = _retaining(tmp_path, 4)
    with pytest.raises(ValueError, match="retain_share"):
        server.set_retain_share(1.5)
    assert server.retain("m#1", "tok#1", ["c0"], 30.0).refused  # no share set yet: none
    server.set_retain_share(0.5, owner_share=0.5)  # two entries in all, one per tenant
    a = server.retain("m#1", "tok#1", ["c0", "c1"], 30.0, owner="a")
    assert len(a.pinned) == 1 and len(a.owner_refused) == 1
    b = server.retain("m#1", "tok#1", ["c2"], 30.0, owner="b")
    assert len(b.pinned) == 1
    c = server.retain("m#1", "tok#1", ["c3"], 30.0, owner="c")
    assert c.refused and not c.owner_refused  # the share is full
    assert len(list(tmp_path.rglob("*.pin"))) == 2
    server.release("m#1", "tok#1", ["c0"])
    assert len(list(tmp_path.rglob("*.pin"))) == 1
    worker = FolderSegmentStore(tmp_path, 0, folder_bytes=3 * entry // 2, clock=clock)
    assert _held(worker, cids) == ["c2"]  # only the pinned one is left
    server.clear()
    assert not list(tmp_path.rglob("*.*")) and server.retention_stats().pinned_bytes == 0


def test_a_pin_ended_for_another_tenants_reservation_loses_its_pin_file(
    tmp_path: Path,
) -> None:
    """Tenant a holds the whole share (two entries); c, under its reservation of one, gets a
    pin by ending a's soonest to expire: that entry's pin file goes, and another process's
    scan may evict it; a's other pin holds."""
    cids, entry, clock, server = _retaining(tmp_path, 4)
    server.set_retain_share(0.5, owner_share=1.0, owner_reserve=0.5)
    assert len(server.retain("m#1", "tok#1", ["c0"], 60.0, owner="a").pinned) == 1
    a1 = server.retain("m#1", "tok#1", ["c1"], 30.0, owner="a")
    assert len(a1.pinned) == 1
    c = server.retain("m#1", "tok#1", ["c2"], 60.0, owner="c")
    assert len(c.pinned) == 1 and len(c.preempted) == 1
    assert server.retention_stats().preempted == 1
    assert c.preempted == a1.pinned and len(list(tmp_path.rglob("*.pin"))) == 2
    assert not Path(str(c.preempted[0])).with_suffix(".pin").exists()
    worker = FolderSegmentStore(tmp_path, 0, folder_bytes=5 * entry // 2, clock=clock)
    assert _held(worker, cids) == ["c0", "c2"]  # c1's pin ended: evicted with the unpinned


@pytest.mark.parametrize("planted", ["soon", "inf", "nan", "", "link"])
def test_a_pin_file_that_does_not_parse_protects_nothing(tmp_path: Path, planted: str) -> None:
    cids = ["c0", "c1"]
    entry = _aged(tmp_path, cids)
    pin = _kv_paths(tmp_path, cids)[0].with_suffix(".pin")
    if planted == "link":  # a link to a far-future time elsewhere is not followed
        target = tmp_path / "elsewhere"
        target.write_text("9e18\n")
        pin.symlink_to(target)
    else:
        pin.write_text(planted)
    worker = FolderSegmentStore(tmp_path, 0, folder_bytes=3 * entry // 2, clock=Clock())
    assert _held(worker, cids) == ["c1"] and not pin.exists() and not pin.is_symlink()
