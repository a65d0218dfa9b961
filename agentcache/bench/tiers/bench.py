"""`agentcache bench-tiers`: spill policies of the tiered store measured on agent sessions.

Per policy, a fresh engine whose fast tier holds one request's working set (so a batch of
sessions spills to disk), then:

    rounds  : the sessions of a batch run turn by turn, one thread per session, all threads
              of a round started together; round throughput = turns / round wall time
    writes  : write amplification = bytes written to the disk tier (pages + journal) / K/V
              bytes the disk tier lacked when written (a page with no disk copy whole, one
              with a stale copy its stale token slots); write calls on the disk tier
    TTFT    : on sample turns, prefill with every page demoted to disk (OS cache dropped for
              the extent files) vs the same prefill right after, with the KV resident in fast;
              a disk tier that cannot take the demoted pages (full, gone) ends the sampling
              and is reported (`ttft_error`), the rounds' figures are kept
    store   : the rounds' store calls, recorded, replayed on a fresh store without the model
              (bench/tiers/trace.py): the turns/s the store alone allows, the bound spill
              I/O sets when compute is fast; the replay must repeat the run's disk writes
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from agentcache.bench.tiers.report import round_figures
from agentcache.bench.tiers.trace import recording, replay
from agentcache.bench.tiers.trace_file import SavedTrace, save
from agentcache.errors import CacheDirError, ConfigError
from agentcache.model.loading import LoadedModel
from agentcache.policy.spill import SPILL_POLICIES
from agentcache.reuse import STRATEGIES
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.tiers.base import TierError
from agentcache.tiers.config import TierConfig
from agentcache.tiers.disk import DiskTier
from agentcache.tiers.store import TieredSegmentStore
from agentcache.workload.files import Session

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TierBenchConfig:
    policies: tuple[str, ...] = ("slide", "lru")
    batch: int = 8
    strategy: str = "rpdc"
    kv_pages: int = 256  # one request's working set: kv_pages * 16 tokens
    fast_bytes: int | None = None  # None: exactly one working set
    host_bytes: int = 0
    ttft_samples: int = 4
    fsync: bool = True
    disk_root: Path | None = None  # parent of the disk tiers (created); None: the temp folder
    adopt: bool = True  # TierConfig.adopt_recomputed: recomputed tokens make dirty pages
    replays: int = 3  # store replays without the model (median reported); 0: none
    trace_dir: Path | None = None  # save each policy's store trace there (replay-trace reads it)

    def __post_init__(self) -> None:
        if not self.policies:
            raise ConfigError("no spill policy to measure")
        for policy in self.policies:
            SPILL_POLICIES.get(policy)  # unknown names list the known ones
        STRATEGIES.get(self.strategy)  # unknown names fail here, listing the known ones
        if self.batch < 1 or self.kv_pages < 1:
            raise ConfigError(f"batch and kv_pages must be >= 1, got {self.batch}, {self.kv_pages}")
        if min(self.ttft_samples, self.host_bytes, self.replays) < 0:
            raise ConfigError(
                f"ttft_samples, host_bytes and replays must be >= 0, got {self.ttft_samples}, "
                f"{self.host_bytes}, {self.replays}"
            )


def run_policy(
    model: LoadedModel, sessions: list[Session], policy: str, cfg: TierBenchConfig,
    advance: Progress,
) -> dict[str, Any]:  # fmt: skip
    root = disk_folder(policy, cfg.disk_root)
    try:
        engine = _engine(model, policy, cfg, root)
        store = engine.store
        assert isinstance(store, TieredSegmentStore)
        with recording(store) as trace:
            rounds, turns = _rounds(engine, sessions, cfg.batch, advance, trace.mark_round)
        after_rounds = store.counters()
        disk_tier = store.tiers[-1]
        assert isinstance(disk_tier, DiskTier)
        disk = disk_tier.counters
        required = store.tier_stats.persist_required_bytes
        writes = {
            "write_amplification": disk.bytes_written / max(1, required),
            "write_calls": disk.write_calls,
            "disk_write_s": disk.write_s,
            # in the rounds' disk reads: loads of spilled pages, checksums, deltas applied
            "disk_read_s": disk.read_s,
            "disk_bytes_written": disk.bytes_written,
            "persist_required_bytes": store.tier_stats.persist_required_bytes,
            # the same, counting a page with a stale disk copy whole (what every page write
            # would carry without deltas)
            "persist_required_page_bytes": store.tier_stats.persist_required_page_bytes,
            "disk_pages_written": disk.writes,
            "disk_delta_pages": disk.delta_writes,
            "dropped_clean": store.tier_stats.dropped_clean,
            "spills": store.tier_stats.spills,
            "failed_spills": store.tier_stats.failed_spills,
            "tier_errors": store.tier_stats.errors[-5:],  # the last tier errors, newest last
            "dirty_page_updates": store.tier_stats.updates,
            "whole_page_updates": store.tier_stats.whole_updates,
            "evictions": store.stats.evictions,
            "tiers": store.counters(),
            # part of disk_bytes_written: live pages moved out of mostly-dead extent files
            "disk_reclaim_bytes": disk_tier.reclaim_bytes,
            "disk_journal_compactions": disk_tier.compactions,
        }  # fmt: skip
        assert engine.config.tiers is not None
        saved = SavedTrace(trace, engine.config.tiers, engine.config.eviction, after_rounds)
        if cfg.trace_dir is not None:
            save(saved, trace_path(cfg.trace_dir, policy))
        ttft = _ttft_disk_vs_resident(engine, sessions, cfg.ttft_samples, advance)
        store_only = replays(saved, cfg.replays, f"{policy}-replay", cfg.disk_root)
        if cfg.replays:
            advance("store replay")
        overlaps = [t["load_overlap"] for t in turns if t["load_overlap"] is not None]
        return writes | ttft | round_figures(rounds) | {
            "load_overlap_mean": statistics.fmean(overlaps) if overlaps else None,
            "store_only": store_only,
            "ttft_ms_median": statistics.median(t["ttft_ms"] for t in turns),
            "rounds": rounds,
            "turns": turns,
        }  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def trace_path(folder: Path, policy: str) -> Path:
    return folder / f"{policy}.trace.json.gz"


def replays(
    saved: SavedTrace, times: int, label: str, disk_root: Path | None
) -> dict[str, Any] | None:
    """`times` replays of a trace, each on a fresh store in its own folder under `disk_root`;
    the summary of the replay of median time, with every replay's seconds (None: no replay)."""
    runs = []
    for _ in range(times):
        with fresh_store(saved, label, disk_root) as store:
            runs.append(replay(saved.trace, store, saved.expected).summary())
    if not runs:
        return None
    runs.sort(key=lambda r: r["seconds"])
    median = runs[(len(runs) - 1) // 2]
    mismatches = [m for r in runs for m in r["mismatches"]]
    return median | {
        "replays_s": [r["seconds"] for r in runs],
        "matches_run": not mismatches,
        "mismatches": mismatches[:20],
    }


@contextmanager
def fresh_store(
    saved: SavedTrace, label: str, disk_root: Path | None
) -> Iterator[TieredSegmentStore]:
    """A store configured like the recorded one, its disk tier in a new folder under
    `disk_root`, removed after."""
    root = disk_folder(label, disk_root)
    try:
        yield saved.store(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def disk_folder(policy: str, parent: Path | None) -> Path:
    """A fresh folder for one policy's disk tier, under `parent` (created with its parents)."""
    try:
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"tiers-{policy}-", dir=parent))
    except OSError as e:
        raise CacheDirError(
            f"cannot make a disk tier folder in {parent or tempfile.gettempdir()} "
            f"({e.strerror or e}); choose a writable disk_root (--disk-dir)"
        ) from e


def _engine(model: LoadedModel, policy: str, cfg: TierBenchConfig, root: Path) -> Engine:
    c = model.config
    token_bytes = c.kv_bytes_per_token(model.forward.weights.embed.element_size())
    page_size = EngineConfig.page_size  # the pool's tokens per page: the engine's default
    working = min(cfg.kv_pages * page_size, c.max_position_embeddings) * token_bytes
    tiers = TierConfig(
        fast_bytes=cfg.fast_bytes or working, host_bytes=cfg.host_bytes, disk_dir=root,
        spill=policy, fsync=cfg.fsync, adopt_recomputed=cfg.adopt,
    )  # fmt: skip
    return Engine(model, EngineConfig(strategy=cfg.strategy, kv_pages=cfg.kv_pages, tiers=tiers))


def _rounds(
    engine: Engine, sessions: list[Session], batch: int, advance: Progress,
    on_round: Callable[[int], None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    rounds, turns = [], []
    for g in range(0, len(sessions), batch):
        group = sessions[g : g + batch]
        for ti in range(max(len(s.turns) for s in group)):
            live = [s for s in group if ti < len(s.turns)]
            records: list[dict[str, Any]] = []
            barrier = threading.Barrier(len(live))
            jobs = [partial(_turn, engine, s, ti, barrier, records, advance) for s in live]
            t0 = time.perf_counter()
            _run_threads(jobs)
            seconds = time.perf_counter() - t0
            on_round(len(live))
            rounds.append({"batch": g // batch, "turn": ti, "turns": len(live),
                           "seconds": seconds})  # fmt: skip
            turns += records
    return rounds, turns


def _turn(
    engine: Engine, s: Session, ti: int, barrier: threading.Barrier,
    records: list[dict[str, Any]], advance: Progress,
) -> None:  # fmt: skip
    turn = s.turns[ti]
    barrier.wait()
    st = engine.generate(turn.prompt, GenerationParams(turn.max_new_tokens)).stats
    records.append({
        "session": s.name, "turn": ti, "prompt_tokens": st.prompt_tokens,
        "reused_tokens": st.reused_tokens, "ttft_ms": st.ttft_s * 1e3,
        "load_overlap": st.load_overlap,
    })  # fmt: skip
    advance(s.name)


def _run_threads(jobs: Sequence[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def wrap(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _ttft_disk_vs_resident(
    engine: Engine, sessions: list[Session], samples: int, advance: Progress
) -> dict[str, Any]:
    store = engine.store
    assert isinstance(store, TieredSegmentStore)
    disk = store.tiers[-1]
    assert isinstance(disk, DiskTier)
    pairs = []
    error = None
    for s in sessions[:samples]:
        prompt = engine.tokenize(s.turns[-1].prompt)
        for _ in range(2 if error is None else 0):
            try:
                store.demote_all()
            except TierError as e:  # disk full or gone: keep the rounds' figures, say why
                error = str(e)
                break
            disk.drop_os_cache()
            from_disk = _timed_prefill(engine, prompt)
            resident = _timed_prefill(engine, prompt)
            pairs.append((from_disk, resident))
        advance(f"{s.name} ttft")
    if not pairs:
        return {"ttft_disk_over_resident": None, "ttft_error": error}
    return {
        "ttft_error": error,
        "ttft_disk_over_resident": statistics.median(d / r for d, r in pairs),
        "ttft_disk_ms_median": statistics.median(d for d, _ in pairs) * 1e3,
        "ttft_resident_ms_median": statistics.median(r for _, r in pairs) * 1e3,
        "ttft_pairs_ms": [[d * 1e3, r * 1e3] for d, r in pairs],
    }


def _timed_prefill(engine: Engine, prompt: Any) -> float:
    t0 = time.perf_counter()
    seq, _ = engine.prefill(prompt)
    elapsed = time.perf_counter() - t0
    seq.free()
    return elapsed
