"""What a sparse decode did: steps, reranks, tier bytes, promotions, verification."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeStats:
    steps: int
    fast_tier_kv_bytes: int  # arena of head-pages (allocated capacity)
    metadata_bytes: int  # MinMax metadata, also in the fast tier
    host_tier_kv_bytes: int
    head_reranks: int  # (layer, head) re-scorings
    rerank_s: float  # time in scoring, top-K and promotion
    rerank_steps: int  # steps in which at least one offloaded head reranked
    pages_promoted: int  # head-pages copied host -> fast tier after the first step
    initial_pages_promoted: int  # first step: the initial top-K of offloaded heads
    bytes_promoted: int
    table_rows_synced: int
    budget_pages: int  # after clamping
    budget_clamped: bool
    verify_passes: int = 0  # dense passes over drafted tokens
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafted tokens the dense pass agreed with
    host_bytes_read: int = 0  # offloaded heads' KV read from the host tier by dense passes
    verify_skipped: bool = False  # verification configured but off (sampling, or a token
    # constraint: structured outputs, logprobs)
    selected_pages: int = 0  # top pages kept over all head reranks (< budget each with top_p)
    streaming_heads: int = 0  # (layer, KV head)s attending only the sink and a window
    window_pages: int = 0  # the streaming heads' window

    @property
    def selected_pages_per_rerank(self) -> float:
        return self.selected_pages / self.head_reranks if self.head_reranks else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def bytes_promoted_per_rerank(self) -> float:
        return self.bytes_promoted / self.rerank_steps if self.rerank_steps else 0.0
