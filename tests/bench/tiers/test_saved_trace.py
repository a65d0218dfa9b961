"""Saved store traces: written by bench-tiers --save-traces, replayed by `agentcache
replay-trace`, and bad files a clear error."""

from __future__ import annotations

import gzip
import json
import pstats
from pathlib import Path

import pytest

from agentcache.bench.tiers.bench import TierBenchConfig, run_policy, trace_path
from agentcache.bench.tiers.trace import replay
from agentcache.bench.tiers.trace_file import SavedTrace, load, save
from agentcache.cli import main
from agentcache.errors import TraceFileError
from agentcache.model.loading import LoadedModel
from agentcache.tiers import TieredSegmentStore
from agentcache.workload.files import Session, Turn
from tests.bench.tiers.test_trace import recorded_run, tight
from tests.tiers.conftest import agent_turn


@pytest.fixture
def saved_slide(tiny: LoadedModel, tmp_path: Path) -> tuple[Path, SavedTrace]:
    trace, engine = recorded_run(tiny, tmp_path / "run", "slide")
    store = engine.store
    assert isinstance(store, TieredSegmentStore)
    saved = SavedTrace(trace, tight(tmp_path / "run", "slide"), "lru", store.counters())
    path = tmp_path / "slide.trace.json.gz"
    save(saved, path)
    return path, saved


def test_a_saved_trace_loads_as_it_was_and_replays_to_the_runs_counters(
    saved_slide: tuple[Path, SavedTrace], tmp_path: Path
) -> None:
    path, saved = saved_slide
    loaded = load(path)
    assert loaded.trace.ops == saved.trace.ops and loaded.trace.rounds == saved.trace.rounds
    assert (loaded.trace.layout, loaded.trace.dtype) == (saved.trace.layout, saved.trace.dtype)
    assert loaded.expected == saved.expected and loaded.eviction == "lru"
    # the configuration, without the recorded run's folder: each replay gets its own
    assert loaded.config.disk_dir is None and loaded.config.spill == "slide"
    assert loaded.config.fast_bytes == saved.config.fast_bytes and not loaded.config.fsync
    store = loaded.store(tmp_path / "fresh")
    assert store.tiers[-1].name == "disk" and store.config.disk_dir == tmp_path / "fresh"
    result = replay(loaded.trace, store, loaded.expected)
    assert result.mismatches == [] and result.counters["disk"]["writes"] > 0
    assert not list(path.parent.glob("*.tmp"))  # written to a temporary name, then renamed


def test_replay_trace_reports_the_store_only_rate_and_profiles_a_replay(
    saved_slide: tuple[Path, SavedTrace], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, saved = saved_slide
    prof = tmp_path / "prof" / "slide.prof"
    disk = tmp_path / "replays"
    argv = ["replay-trace", str(path), "--replays", "2", "--disk-dir", str(disk),
            "--profile", str(prof), "--top", "5"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(f"| {path.name}"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "slide" and cells[2] == str(len(saved.trace.ops))
    assert int(cells[3]) == sum(n for _, n in saved.trace.rounds) and float(cells[4]) > 0
    assert len(cells[6].split(",")) == 2 and cells[7] == "yes"
    # the profile: a pstats file, and its top functions printed
    assert "function calls" in out and f"wrote {prof}" in out
    stats = pstats.Stats(str(prof))
    assert any(name == "update_pages" for _, _, name in stats.stats)  # type: ignore[attr-defined]
    assert list(disk.iterdir()) == []  # every replay's disk tier removed


def test_replay_trace_fails_when_the_replay_does_not_repeat_the_run(
    saved_slide: tuple[Path, SavedTrace], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, saved = saved_slide
    disk = saved.expected["disk"]
    wrong = disk | {"write_calls": disk["write_calls"] + 1}
    other = tmp_path / "other.trace.json.gz"
    save(SavedTrace(saved.trace, saved.config, saved.eviction,
                    saved.expected | {"disk": wrong}), other)  # fmt: skip
    assert main(["replay-trace", str(other), "--replays", "1"]) == 1
    captured = capsys.readouterr()
    assert "| no |" in captured.out
    assert "the replay did not repeat the run" in captured.err
    assert "disk.write_calls" in captured.err


def write_gz(path: Path, body: object) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(body, f)
    return path


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no trace file"),
        (b"not gzip at all", "is not a saved store trace (not gzip-compressed JSON"),
        ({"format": "something-else"}, "is JSON but not a store trace"),
        ({"format": "agentcache-store-trace", "version": 99}, "format version 99"),
        ({"format": "agentcache-store-trace", "version": 1}, "is malformed: 'ops'"),
    ],
)
def test_a_bad_trace_file_is_a_clear_error(
    tmp_path: Path, content: object, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.trace.json.gz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        write_gz(path, content)
    with pytest.raises(TraceFileError) as e:
        load(path)
    assert needle in str(e.value)
    assert main(["replay-trace", str(path)]) == 2
    assert needle in capsys.readouterr().err


def test_a_trace_with_a_bad_field_is_malformed(
    saved_slide: tuple[Path, SavedTrace], tmp_path: Path
) -> None:
    path, _ = saved_slide
    with gzip.open(path, "rt") as f:
        body = json.load(f)
    for field, value, needle in [
        ("dtype", "nn", "not a torch dtype"),
        ("layout", [1, 2], "is not [layers, KV heads, head dim]"),
        ("config", {"spill": "nope"}, "unknown spill policy 'nope'"),
        ("ops", [["poke", "m", "t", "c", True, 0, None, []]], "an op of unknown kind"),
    ]:
        bad = write_gz(tmp_path / f"{field}.trace.json.gz", body | {field: value})
        with pytest.raises(TraceFileError, match="is malformed") as e:
            load(bad)
        assert needle in str(e.value)


def test_bench_tiers_saves_each_policys_trace_when_asked(tiny: LoadedModel, tmp_path: Path) -> None:
    sessions = [Session(f"s{s}", "tiny", "", tuple(Turn(agent_turn(t, s), 1) for t in range(2)))
                for s in range(2)]  # fmt: skip
    cfg = TierBenchConfig(("slide",), batch=2, kv_pages=64, ttft_samples=0, fsync=False,
                          disk_root=tmp_path / "d", replays=1,
                          trace_dir=tmp_path / "traces")  # fmt: skip
    result = run_policy(tiny, sessions, "slide", cfg, lambda _: None)
    loaded = load(trace_path(tmp_path / "traces", "slide"))
    assert loaded.expected["disk"]["writes"] == result["tiers"]["disk"]["writes"]
    assert sum(n for _, n in loaded.trace.rounds) == 4 and loaded.config.spill == "slide"
    replayed = replay(loaded.trace, loaded.store(tmp_path / "again"), loaded.expected)
    assert replayed.mismatches == []
