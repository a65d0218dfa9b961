"""Prometheus metrics of one server, in its own registry (no process-global state)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agentcache.chat.retention import RetentionReport, TurnRetention
from agentcache.chat.runner import ChatResult
from agentcache.kv.pool import PagePool
from agentcache.runtime.scheduler import BatchScheduler, BatchStats
from agentcache.server.heap import heap_usage, resident_bytes
from agentcache.tiers.store import TieredSegmentStore

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The embedded engine's store is one in-memory tier; the vLLM backend's is the shared folder.
STORE_TIER = "memory"
BATCH_KINDS = (
    "steps", "peak_batch", "preempted", "resumed", "swapped_bytes", "recomputed_tokens",
    "waiting_preempted", "prefill_chunks", "mixed_steps", "fused_chunks", "separate_chunks",
)  # fmt: skip


# the tiered store's counts (`--store-host-bytes`, `--store-disk-dir`), since start
TIER_KINDS = (
    "spilled_bytes", "spilled_pages", "prefetched_pages", "promoted_pages", "unpromoted_pages",
    "spills", "failed_spills",
)  # fmt: skip


def tier_store(engine: object) -> TieredSegmentStore | None:
    """An engine's segment store when it is tiered; None for the flat store and the vLLM
    backend's folder."""
    store = getattr(engine, "store", None)
    return store if isinstance(store, TieredSegmentStore) else None


def tier_counts(store: TieredSegmentStore) -> dict[str, int]:
    """TIER_KINDS of a tiered store: spilled_bytes and spilled_pages are what its spills wrote
    below the fast tier (a page spilled from host to disk counts again; the disk tier's bytes
    include its record headers), prefetched_pages those moved up to fast ahead of a paused
    conversation's next request, promoted_pages those a lookup read from a lower tier (moved
    up, or unpromoted_pages when fast had no room), spills the times a full tier asked its
    spill policy for room."""
    st, lower = store.tier_stats, store.tiers[1:]
    return {
        "spilled_bytes": sum(t.counters.bytes_written for t in lower),
        "spilled_pages": st.written_pages, "prefetched_pages": st.prefetched_pages,
        "promoted_pages": sum(t.counters.hits for t in lower),
        "unpromoted_pages": st.unpromoted, "spills": st.spills, "failed_spills": st.failed_spills,
    }  # fmt: skip


def engine_preemptions(engine: object) -> int | None:
    """The vLLM backend's count of vLLM's preemptions (`VLLMBackend.preemptions`); None for an
    engine without one."""
    n = getattr(engine, "preemptions", None)
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def pool_pages(engine: object) -> dict[str, int] | None:
    """The embedded engine's KV page pool now: pages `used`, `free`, `shared` (held by more
    than one request: kv/shared.py) and its `capacity`; None for an engine without one (the
    vLLM backend)."""
    ctx = getattr(engine, "ctx", None)
    pool = getattr(ctx, "pool", None)
    if not isinstance(pool, PagePool):
        return None
    return {"used": pool.num_used, "free": pool.num_free, "shared": pool.num_shared,
            "capacity": pool.config.num_pages}  # fmt: skip


def batch_stats(engine: object) -> BatchStats | None:
    """The counts of an engine's batched scheduler; None for one without (the vLLM backend,
    the embedded engine with `--no-batch-decode`)."""
    batch = getattr(engine, "batch", None)
    return batch.stats() if isinstance(batch, BatchScheduler) else None


class ServerMetrics:
    """`store_bytes` gives the segment store's bytes per tier (`ServingEngine.store_bytes`),
    `line` the requests at the engine and waiting for it, `work` the prompt tokens waiting
    and the characters being tokenized, `conversations` the tracker's
    estimated bytes and conversations, `batch` the batched scheduler's counts (None without
    one: the vLLM backend, `--no-batch-decode`), `preemptions` the vLLM backend's count of
    vLLM's preemptions (`engine_preemptions`, read when `batch` gives None); all are read
    at each scrape, with the
    process's memory (resident, and malloc's bytes in use and free but held, where the
    platform says)."""

    def __init__(
        self,
        store_bytes: Callable[[], dict[str, int]],
        line: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0),
        conversations: Callable[[], tuple[int, int]] = lambda: (0, 0),
        work: Callable[[], tuple[int, int]] = lambda: (0, 0),
        batch: Callable[[], BatchStats | None] = lambda: None,
        retention: TurnRetention | None = None,
        tiers: TieredSegmentStore | None = None,
        preemptions: Callable[[], int | None] = lambda: None,
        pages: Callable[[], dict[str, int] | None] = lambda: None,
    ) -> None:
        self._store_bytes, self._line, self._conversations = store_bytes, line, conversations
        self._work, self._batch, self._retention = work, batch, retention
        self._preemptions = preemptions
        self._pages = pages
        self._tiers = tiers
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "agentcache_requests", "HTTP requests", ["endpoint", "status"], registry=r
        )
        self.ttft = Histogram(
            "agentcache_ttft_seconds", "prefill time to first token", buckets=TTFT_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter("agentcache_prompt_tokens", "prompt tokens", registry=r)
        self.reused_tokens = Counter(
            "agentcache_reused_tokens", "prompt tokens whose KV was reused", registry=r
        )
        self.recomputed_tokens = Counter(
            "agentcache_recomputed_tokens", "prompt tokens computed", registry=r
        )
        self.completion_tokens = Counter(
            "agentcache_completion_tokens", "generated tokens", registry=r
        )
        self.cache_hits = Counter(
            "agentcache_cache_hits", "segments found in the store", ["tier"], registry=r
        )
        self.cache_misses = Counter(
            "agentcache_cache_misses", "segments not found, by reason", ["reason"], registry=r
        )
        self.fallbacks = Counter(
            "agentcache_fallbacks", "reusable KV a strategy could not use", registry=r
        )
        self.decode_turns = Counter(
            "agentcache_decode_turns",
            "turns decoded, by the decode policy that ran and why a sparse one fell back",
            ["policy", "fallback"], registry=r,
        )  # fmt: skip
        self.shared_pages = Counter(
            "agentcache_shared_pages", "KV pages turns held in common with running turns (the "
            "same opening, the same K/V bits) instead of their own, since start",
            registry=r,
        )  # fmt: skip
        self.kv_pages = Gauge(
            "agentcache_kv_pages", "the embedded engine's KV page pool now: used, free, shared "
            "(held by more than one request) and capacity pages", ["kind"], registry=r,
        )  # fmt: skip
        self.stream_mismatches = Counter(
            "agentcache_stream_mismatches", "streams whose pieces differ from the final text",
            registry=r,
        )  # fmt: skip
        self.rejected_tokens = Counter(
            "agentcache_rejected_conversation_tokens",
            "conversation tokens that did not verify (the request started a new conversation)",
            registry=r,
        )
        self.cancelled = Counter(
            "agentcache_cancelled", "generations stopped because their client left", registry=r
        )
        self.store_bytes = Gauge(
            "agentcache_store_bytes", "bytes held by the segment store", ["tier"], registry=r
        )

        self.active = Gauge(
            "agentcache_requests_active", "requests at the engine (--max-active)", registry=r
        )
        self.active_tokens = Gauge(
            "agentcache_requests_active_tokens",
            "tokens (prompt + max_tokens) the requests at the engine reserve "
            "(--max-active-tokens)", registry=r,
        )  # fmt: skip
        self.waiting = Gauge(
            "agentcache_requests_waiting", "requests waiting in line (--max-queued)", registry=r
        )
        self.waiting_tokens = Gauge(
            "agentcache_requests_waiting_tokens",
            "prompt tokens of the requests waiting in line (--max-queued-tokens)", registry=r,
        )  # fmt: skip
        self.tokenizing_chars = Gauge(
            "agentcache_tokenizing_chars",
            "characters of requests being tokenized (--max-tokenizing-chars)", registry=r,
        )  # fmt: skip
        self.conversation_bytes = Gauge(
            "agentcache_conversation_bytes",
            "estimated bytes the server remembers of conversations (--conversation-bytes)",
            registry=r,
        )
        self.conversations = Gauge(
            "agentcache_conversations", "conversations the server remembers", registry=r
        )
        self.resident_bytes = Gauge(
            "agentcache_resident_bytes", "the server process's resident memory", registry=r
        )
        self.heap_bytes = Gauge(
            "agentcache_heap_bytes", "malloc's bytes: in_use (handed out) and free_held (free "
            "but kept by the process)", ["kind"], registry=r,
        )  # fmt: skip

        self.batch = Gauge(
            "agentcache_batch", "the batched scheduler's counts since start: steps, peak_batch "
            "(most requests in one step), preempted, resumed, swapped_bytes (KV copied to the "
            "host by preemptions), recomputed_tokens (on resume); waiting_preempted is now. "
            "On --backend vllm, preempted alone: vLLM's preemptions of finished turns' "
            "requests",
            ["kind"], registry=r,
        )  # fmt: skip

        self.step_seconds = Gauge(
            "agentcache_step_seconds", "seconds of the batched scheduler's model work since "
            "start, by part: attention:dense, attention:sparse, attention:verify (each kind of "
            "row's attention with its per-layer work), chunks (the attention of prefill chunks "
            "fused into a step), rest (what a step's rows share: matrix products, norms, "
            "logits), alone (a request's step on its own)",
            ["part"], registry=r,
        )  # fmt: skip

        self.tier_counts = Gauge(
            "agentcache_tiers", "the tiered store's counts since start (--store-host-bytes, "
            "--store-disk-dir): spilled_bytes and spilled_pages (written below the fast tier "
            "by spills), prefetched_pages (moved up to fast when a paused conversation's next "
            "request arrived), promoted_pages (read from a lower tier by a lookup), "
            "unpromoted_pages (served from below, no room in fast), spills (full-tier events), "
            "failed_spills", ["kind"], registry=r,
        )  # fmt: skip
        self.tier_bytes = Gauge(
            "agentcache_tier_bytes", "bytes each tier of the tiered store holds now, and the "
            "most it may (capacity)", ["tier", "kind"], registry=r,
        )  # fmt: skip

        self.retained = Gauge(
            "agentcache_retained", "the store's retained entries now (segments, bytes), the "
            "most bytes they may hold (cap_bytes: --retention-share), retentions refused for "
            "a cap since start (refused), and of those, for the tenant's part of the share "
            "(refused_tenant: --retention-tenant-share), and retentions released early since "
            "start for another tenant's reservation (preempted: --retention-tenant-reserve)",
            ["kind"], registry=r,
        )  # fmt: skip
        self.retained_turns = Counter(
            "agentcache_retained_turns", "turns whose segments were retained, by where the "
            "time came from (request: a cache control; learned: a tool call)", ["source"],
            registry=r,
        )  # fmt: skip
        self.resumed_pauses = Counter(
            "agentcache_resumed_pauses", "requests that resumed a retained turn's conversation",
            registry=r,
        )  # fmt: skip

    def _record_retention(self, kept: RetentionReport | None) -> None:
        if kept is None:
            return
        if kept.granted_s is not None:
            self.retained_turns.labels(kept.source).inc()
        if kept.resumed_after_s is not None:
            self.resumed_pauses.inc()

    def record_turn(self, result: ChatResult) -> None:
        """A finished turn: its client's report, the engine's own fallback count, the decode
        policy that ran (`fallback`: `short`, a turn its sparse budget covers whole; `profile`,
        no usable head profile; `none`) and what it retained."""
        report, decode = result.report, result.generation.stats
        self.decode_turns.labels(decode.decode_policy, decode.decode_fallback_kind or "none").inc()
        self.shared_pages.inc(decode.shared_pages)
        self._record_retention(result.retention)
        self.ttft.observe(report.ttft_s)
        self.prompt_tokens.inc(report.prompt_tokens)
        self.reused_tokens.inc(report.reused_tokens)
        self.recomputed_tokens.inc(report.recomputed_tokens)
        self.completion_tokens.inc(result.completion_tokens)
        self.fallbacks.inc(result.fallbacks)
        for seg in report.segments:
            if seg.status in ("hit", "moved"):
                self.cache_hits.labels(STORE_TIER).inc()
        for seg in report.misses:
            self.cache_misses.labels(seg.reason or "unknown").inc()

    def render(self) -> bytes:
        for tier, n in self._store_bytes().items():
            self.store_bytes.labels(tier).set(n)
        active, waiting, active_tokens = self._line()
        self.active.set(active)
        self.active_tokens.set(active_tokens)
        self.waiting.set(waiting)
        waiting_tokens, tokenizing = self._work()
        self.waiting_tokens.set(waiting_tokens)
        self.tokenizing_chars.set(tokenizing)
        nbytes, count = self._conversations()
        self.conversation_bytes.set(nbytes)
        self.conversations.set(count)
        if (b := self._batch()) is not None:
            for kind in BATCH_KINDS:
                self.batch.labels(kind).set(getattr(b, kind))
            for part, seconds in b.step_seconds.items():
                self.step_seconds.labels(part).set(seconds)
        elif (preempted := self._preemptions()) is not None:  # the vLLM backend's, alone
            self.batch.labels("preempted").set(preempted)
        if (store := self._tiers) is not None:
            with store.locked():
                for kind, n in tier_counts(store).items():
                    self.tier_counts.labels(kind).set(n)
                for t in store.tiers:
                    self.tier_bytes.labels(t.name, "held").set(t.counters.bytes)
                    self.tier_bytes.labels(t.name, "capacity").set(t.capacity_bytes)
        if (kept := self._retention) is not None and kept.store is not None:
            s = kept.store.retention_stats()
            for kind, n in (("segments", s.pinned_entries), ("bytes", s.pinned_bytes),
                            ("cap_bytes", s.max_bytes), ("refused", s.refused),
                            ("refused_tenant", s.owner_refused),
                            ("preempted", s.preempted)):  # fmt: skip
                self.retained.labels(kind).set(n)
        if (pages := self._pages()) is not None:
            for kind, n in pages.items():
                self.kv_pages.labels(kind).set(n)
        if (rss := resident_bytes()) is not None:
            self.resident_bytes.set(rss)
        if (heap := heap_usage()) is not None:
            self.heap_bytes.labels("in_use").set(heap.in_use)
            self.heap_bytes.labels("free_held").set(heap.free_held)
        return generate_latest(self.registry)
