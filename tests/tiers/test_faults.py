"""Faults at the engine level: the disk tier stops accepting writes mid-session."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.errors import CacheDirError
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.tiers import TierConfig, TieredSegmentStore
from tests.tiers.conftest import agent_turn

KV_PAGES = 64
WORKING_SET = KV_PAGES * 16 * 4 * 2 * 16 * 2 * 4  # tiny model bytes per token: 1 KiB


def test_unwritable_disk_keeps_the_engine_serving_and_counts_failed_spills(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiers = TierConfig(fast_bytes=WORKING_SET, disk_dir=tmp_path, fsync=False)
    engine = Engine(tiny, EngineConfig(strategy="rpdc", kv_pages=KV_PAGES, tiers=tiers))
    store = engine.store
    assert isinstance(store, TieredSegmentStore)

    def denied(path: Path, data: bytes) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(store.tier("disk"), "_write_file", denied)
    params = GenerationParams(max_new_tokens=3)
    for s in range(3):
        for t in range(3):
            gen = engine.generate(agent_turn(t, s), params)
            assert len(gen.token_ids) == 3
    assert store.tier_stats.failed_spills > 0
    assert "Permission denied" in store.tier_stats.errors[-1]
    assert store.tier("disk").counters.failed_writes > 0
    assert store.tier("disk").counters.pages == 0
    assert store.stats.rejected > 0  # segments that found no room were not stored
    assert store.tier("fast").counters.bytes <= WORKING_SET


def test_unwritable_disk_folder_at_start_is_a_clear_error(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    tiers = TierConfig(fast_bytes=WORKING_SET, disk_dir=blocker / "kv")
    with pytest.raises(CacheDirError, match="not writable"):
        Engine(tiny, EngineConfig(kv_pages=KV_PAGES, tiers=tiers))


def test_disk_folder_whose_journal_cannot_be_read_is_a_clear_error(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    (tmp_path / "journal.log").mkdir()  # the folder is writable, its journal is not a file
    tiers = TierConfig(fast_bytes=WORKING_SET, disk_dir=tmp_path)
    with pytest.raises(CacheDirError) as e:
        Engine(tiny, EngineConfig(kv_pages=KV_PAGES, tiers=tiers))
    assert f"disk tier folder {tmp_path} cannot be opened" in str(e.value)
    assert "journal.log" in str(e.value)


@pytest.mark.parametrize("lowest", ["disk", "host"])
def test_lowest_tier_too_small_for_one_request_is_a_clear_error(
    tiny: LoadedModel, tmp_path: Path, lowest: str
) -> None:
    """The lowest tier keeps only segments that fit in it: one smaller than a request would
    reject every segment and the engine would silently reuse nothing."""
    from agentcache.tiers import TierCapacityError

    small = {"disk_dir": tmp_path, "disk_bytes": 10} if lowest == "disk" else {"host_bytes": 10}
    tiers = TierConfig(fast_bytes=WORKING_SET, fsync=False, **small)
    with pytest.raises(TierCapacityError) as e:
        Engine(tiny, EngineConfig(kv_pages=KV_PAGES, tiers=tiers))
    assert f"{lowest} tier of 10 bytes cannot hold one request's working set" in str(e.value)
    assert f"raise {lowest}_bytes" in str(e.value)
    # a host tier above a disk tier may be smaller: it spills on to the disk
    middle = TierConfig(fast_bytes=WORKING_SET, host_bytes=10, disk_dir=tmp_path, fsync=False)
    Engine(tiny, EngineConfig(kv_pages=KV_PAGES, tiers=middle))
