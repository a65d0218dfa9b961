"""Store traces: the calls a run made on a tiered store, replayed without the model.

A trace records every lookup, put and page update a `TieredSegmentStore` served, in the order
it served them (under its lock), with token counts and slot masks but no K/V. Replaying it on
a fresh store of the same configuration repeats the run's placement, spill and write
decisions: they depend on sizes, masks and order, never on the K/V values. So the replay's
disk counters must equal the run's (`ReplayResult.mismatches` lists any that differ), and what
it times is the store alone: the rate a batch of sessions would reach if the model took no
time, the bound that spill I/O sets once compute is fast.

    run    : sessions on threads -> engine -> [recording] store      (compute + store)
    replay : trace ops, one thread, synthetic K/V of the same shapes -> fresh store  (store)

`contains_content` is not recorded: it reads one dict entry and changes nothing.

A trace can be saved with the store's configuration and the run's counters and replayed later
(bench/tiers/trace_file.py).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from agentcache.kv.store import StoredKV
from agentcache.tiers.base import PageData
from agentcache.tiers.store import TieredSegmentStore

# the tier counters a replay must reproduce; read_s / write_s are times, so they may differ.
# bytes_written holds the disk journal's lines too, where each page's crc32 is written in
# decimal: 1-10 digits that depend on the K/V values, so it may differ by 9 bytes a page.
REPRODUCED = ("writes", "write_calls", "bytes_written", "delta_writes", "loads", "hits")
CRC_DIGITS_SLACK = 9


@dataclass(frozen=True)
class Op:
    """One store call. put: `tokens` of K/V; update: `pages` as (page index, tokens, slot
    mask); `result` is what the call returned (lookup: hit)."""

    kind: str  # "lookup" | "put" | "update"
    model_id: str
    tokenizer_id: str
    cid: str
    result: bool
    tokens: int = 0
    context_id: str | None = None
    pages: tuple[tuple[int, int, int], ...] = ()


@dataclass
class StoreTrace:
    ops: list[Op] = field(default_factory=list)
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (ops so far, turns) per round
    layout: tuple[int, int, int] | None = None  # (layers, KV heads, head dim) of the K/V
    dtype: torch.dtype = torch.float32

    def mark_round(self, turns: int) -> None:
        """End a round: the ops recorded since the last mark served `turns` turns."""
        self.rounds.append((len(self.ops), turns))

    def _shape(self, t: torch.Tensor) -> None:
        layout = (t.shape[0], t.shape[2], t.shape[3])
        if self.layout is None:
            self.layout, self.dtype = layout, t.dtype
        elif (layout, t.dtype) != (self.layout, self.dtype):
            raise ValueError(f"K/V of shape {layout} {t.dtype} in a trace of {self.layout}")


@contextmanager
def recording(store: TieredSegmentStore) -> Iterator[StoreTrace]:
    """Record the store's calls while the block runs (the store's methods are wrapped on
    this instance only, and restored after)."""
    trace = StoreTrace()
    lock = store.locked()  # re-entrant: each call takes it again inside

    def lookup(orig: Callable[..., Any], model_id: str, tokenizer_id: str, cid: str) -> Any:
        with lock:
            found = orig(model_id, tokenizer_id, cid)
            trace.ops.append(Op("lookup", model_id, tokenizer_id, cid, found.hit))
            return found

    def put(orig: Callable[..., Any], cid: str, kv: StoredKV) -> bool:
        with lock:
            stored = orig(cid, kv)
            trace._shape(kv.keys)
            trace.ops.append(Op("put", kv.model_id, kv.tokenizer_id, cid, stored,
                                kv.num_tokens, kv.context_id))  # fmt: skip
            return bool(stored)

    def update(
        orig: Callable[..., Any], model_id: str, tokenizer_id: str, cid: str,
        updates: dict[int, tuple[PageData, int]],
    ) -> bool:  # fmt: skip
        with lock:
            done = orig(model_id, tokenizer_id, cid, updates)
            for page, _ in updates.values():
                trace._shape(page.keys)
            pages = tuple((i, p.num_tokens, m) for i, (p, m) in sorted(updates.items()))
            trace.ops.append(Op("update", model_id, tokenizer_id, cid, done, pages=pages))
            return bool(done)

    wrapped: dict[str, Callable[..., Any]] = {
        "lookup_content": lookup,
        "put_content": put,
        "update_pages": update,
    }
    for name, wrapper in wrapped.items():
        setattr(store, name, functools.partial(wrapper, getattr(store, name)))
    try:
        yield trace
    finally:
        for name in wrapped:
            delattr(store, name)


@dataclass
class ReplayResult:
    turns_per_s: float  # all rounds' turns / the replay's time in the store
    round_seconds: list[float]
    round_throughputs: list[float]
    throughput_std: float
    counters: dict[str, dict[str, int]]  # the replay store's tier counters
    mismatches: list[str]  # where the replay did not do what the run did (empty: it matched)

    def summary(self) -> dict[str, Any]:
        return {
            "turns_per_s": self.turns_per_s,
            "throughput_std": self.throughput_std,
            "seconds": sum(self.round_seconds),
            "round_throughputs": self.round_throughputs,
            "matches_run": not self.mismatches,
            "mismatches": self.mismatches,
        }


def replay(
    trace: StoreTrace, store: TieredSegmentStore,
    expected: dict[str, dict[str, int]] | None = None,
) -> ReplayResult:  # fmt: skip
    """Run the trace's calls on `store` (fresh, configured like the recorded one), one round
    at a time, timing each round. `expected`: the recorded store's `counters()` after the run,
    compared with the replay's on REPRODUCED; every call's result is compared too."""
    if trace.layout is None:
        raise ValueError("the trace holds no K/V shapes: nothing was put or updated")
    layers, heads, dim = trace.layout
    most = max((o.tokens for o in trace.ops), default=0)
    most = max([most, *(n for o in trace.ops for _, n, _ in o.pages)])
    gen = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(layers, most, heads, dim, generator=gen).to(trace.dtype)
                    for _ in range(2))  # fmt: skip
    positions = torch.arange(most, dtype=torch.long)
    mismatches: list[str] = []
    seconds: list[float] = []
    start = 0
    for end, _ in trace.rounds:
        t0 = time.perf_counter()
        for i in range(start, end):
            op = trace.ops[i]
            got = _call(store, op, keys, values, positions)
            if got != op.result:
                mismatches.append(f"op {i} ({op.kind} {op.cid[:12]}): {got}, run: {op.result}")
        seconds.append(time.perf_counter() - t0)
        start = end
    if start != len(trace.ops):
        raise ValueError(f"{len(trace.ops) - start} ops after the last round mark")
    counters = store.counters()
    for tier, want in (expected or {}).items():
        for key in REPRODUCED:
            have, had = counters.get(tier, {}).get(key), want.get(key)
            if key == "bytes_written" and have is not None and had is not None:
                slack = CRC_DIGITS_SLACK * want.get("writes", 0) if tier == "disk" else 0
                if abs(have - had) <= slack:
                    continue
            if have != had:
                mismatches.append(f"{tier}.{key}: {have}, run: {had}")
    turns = [n for _, n in trace.rounds]
    rates = [n / s if s > 0 else float("inf") for n, s in zip(turns, seconds, strict=True)]
    total = sum(seconds)
    return ReplayResult(
        sum(turns) / total if total > 0 else float("inf"), seconds, rates,
        statistics.pstdev(rates) if len(rates) > 1 else 0.0, counters, mismatches,
    )  # fmt: skip


def _call(
    store: TieredSegmentStore, op: Op, keys: torch.Tensor, values: torch.Tensor,
    positions: torch.Tensor,
) -> bool:  # fmt: skip
    if op.kind == "lookup":
        return store.lookup_content(op.model_id, op.tokenizer_id, op.cid).hit
    if op.kind == "put":
        n = op.tokens
        kv = StoredKV(keys[:, :n], values[:, :n], positions[:n], op.model_id, op.tokenizer_id,
                      op.context_id)  # fmt: skip
        return store.put_content(op.cid, kv)
    updates = {i: (PageData(keys[:, :n], values[:, :n], positions[:n]), mask)
               for i, n, mask in op.pages}  # fmt: skip
    return store.update_pages(op.model_id, op.tokenizer_id, op.cid, updates)
