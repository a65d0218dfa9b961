"""The connector's worker-side mechanics, free of vLLM (so they are tested without it).

    PagedKV         vLLM's per-layer paged tensors, in layer order, read/written per token span
    PrefixTransfer  exact prefix blocks: paged KV <-> store entries keyed by chained block ids
    SegmentFiller   shifted fixed segments: runs an agentcache reuse strategy on the same
                    weights and writes the KV of the claimed span into vLLM's pages
    StoredRunLoader a staged prefill's run (stages.py): stored KV only, keys re-rotated
    save_segments   stores every segment of a finished prefill not stored yet, from the pages
                    (a segment computed after K/V that is not full recompute's is stored
                    under its context marked inexact, as the embedded engine stores it)

Who computes what in segment mode (span = [num_computed, last prompt token)):
    [0, num_computed)          vLLM's own prefix cache (exact)
    span, reused segments      cached KV, keys re-rotated to their new positions (connector)
    span, update tokens +      computed fresh by agentcache's engine over the assembled KV
      strategy-selected tokens   (connector)
    last prompt token (+ any   vLLM, attending over everything above
      tokens after the span)
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentcache.engines.vllm.layout import KVLayout, slots_of
from agentcache.engines.vllm.plan import prefix_chunk_ids
from agentcache.engines.vllm.reports import MissRow
from agentcache.engines.vllm.request import RequestSpec
from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.kv.store import SegmentStore, StoredKV, inexact_context, segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.model.rope import LayerRotary, RotaryEmbedding
from agentcache.reuse.base import ReuseContext, ReuseStats, ReuseStrategy
from agentcache.reuse.segments import context_ids, exact_left
from agentcache.reuse.spec import StrategySpec

MAX_STRATEGIES = 8  # strategy instances a filler keeps
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def layer_order(names: Sequence[str]) -> list[str]:
    """Attention layer names sorted by their layer number ("model.layers.7.self_attn.attn")."""

    def index(name: str) -> int:
        m = _LAYER_INDEX.search(name)
        if m is None:
            raise ValueError(f"cannot tell the layer number of KV cache {name!r}")
        return int(m.group(1))

    return sorted(names, key=index)


class PagedKV:
    """vLLM's KV tensors of every layer, in layer order, seen through one layout."""

    def __init__(self, layers: Sequence[Tensor], layout: KVLayout) -> None:
        self.layers = list(layers)
        self.layout = layout
        self.block_size = layout.shape.block_size
        for layer in self.layers:
            layout.check(layer)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].dtype

    def read(self, block_ids: Sequence[int], start: int, end: int) -> tuple[Tensor, Tensor]:
        """K and V of tokens [start, end): two (L, n, H, D) float32 tensors."""
        slots = slots_of(list(block_ids), self.block_size, start, end)
        ks, vs = zip(*(self.layout.read(t, slots) for t in self.layers), strict=True)
        return torch.stack(ks).float(), torch.stack(vs).float()

    def write(
        self, block_ids: Sequence[int], start: int, end: int, keys: Tensor, values: Tensor
    ) -> None:
        """Write (L, n, H, D) K/V into tokens [start, end)."""
        if keys.shape[0] != len(self.layers) or keys.shape[1] != end - start:
            raise ValueError(
                f"KV of shape {list(keys.shape)} does not fit {len(self.layers)} layers x "
                f"{end - start} tokens"
            )
        slots = slots_of(list(block_ids), self.block_size, start, end)
        for layer, k, v in zip(self.layers, keys, values, strict=True):
            self.layout.write(layer, slots, k, v)


class PrefixTransfer:
    """Exact prefix blocks between vLLM's pages and the store."""

    def __init__(self, store: SegmentStore, model_id: str, tokenizer_id: str) -> None:
        self.store = store
        self.model_id = model_id
        self.tokenizer_id = tokenizer_id

    def present(self, cid: str) -> bool:
        return self.store.contains_content(self.model_id, self.tokenizer_id, cid)

    def load(
        self, kv: PagedKV, token_ids: Sequence[int], block_ids: Sequence[int], start: int, end: int
    ) -> list[int]:
        """Copy stored blocks into tokens [start, end) (block aligned). Returns the vLLM block
        ids that could not be loaded (missing, or failed their checksum): never served."""
        bs = kv.block_size
        chunks = prefix_chunk_ids(token_ids, bs)
        failed = []
        for b in range(start // bs, end // bs):
            found = self.store.lookup_content(self.model_id, self.tokenizer_id, chunks[b])
            if found.kv is None:
                failed.append(block_ids[b])
                continue
            kv.write(block_ids, b * bs, (b + 1) * bs, found.kv.keys, found.kv.values)
        return failed

    def save(self, kv: PagedKV, token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
        """Store every full block of the prompt not stored yet. Returns entries written."""
        bs, written = kv.block_size, 0
        for b, cid in enumerate(prefix_chunk_ids(token_ids, bs)):
            if self.present(cid):
                continue
            keys, values = kv.read(block_ids, b * bs, (b + 1) * bs)
            stored = StoredKV(
                keys, values, torch.arange(b * bs, (b + 1) * bs), self.model_id, self.tokenizer_id
            )
            written += int(self.store.put_content(cid, stored))
        return written


def save_segments(
    store: SegmentStore,
    model_id: str,
    tokenizer_id: str,
    kv: PagedKV,
    spec: RequestSpec,
    token_ids: Sequence[int],
    block_ids: Sequence[int],
    inexact_from: int | None = None,
) -> int:
    """Store every segment of the prompt not stored yet, as agentcache's engine commits them
    (update segments too: today's update is tomorrow's history). Returns entries written.

    `inexact_from`: the first token whose K/V in the pages is not full recompute's (None:
    every token's is). A segment ending after it was computed after K/V reused approximately,
    so its first copy is stored under its context marked inexact (`kv.store.inexact_context`):
    a later prompt with the same context finds it as what this one used there, none takes it
    for an exact run."""
    prompt = spec.tokenized(token_ids)
    written = 0
    for seg, context in zip(prompt.segments, context_ids(prompt), strict=True):
        cid = segment_content_id(seg.ids, seg.segment.scope)
        if store.contains_content(model_id, tokenizer_id, cid):
            continue
        keys, values = kv.read(block_ids, seg.start, seg.end)
        positions = torch.arange(seg.start, seg.end)
        inexact = inexact_from is not None and seg.end > inexact_from
        after = inexact_context(context) if inexact else context
        stored = StoredKV(keys, values, positions, model_id, tokenizer_id, after)
        written += int(store.put_content(cid, stored))
    return written


def stored_inexact_from(
    store: SegmentStore,
    model_id: str,
    tokenizer_id: str,
    spec: RequestSpec,
    token_ids: Sequence[int],
) -> int | None:
    """Where a staged prefill's K/V may stop being full recompute's, read from the store: the
    start of the first segment whose stored copy (what a stage's run loads) was computed after
    other tokens than it follows here, or whose context is unknown. A stage's run loads such
    a copy re-rotated, and vLLM computes what follows over it. Conservative: a segment that
    short-run rules left to vLLM counts too (its later copies are then only not taken for
    exact runs). None: every stored segment of the prompt sits after its own context."""
    prompt = spec.tokenized(token_ids)
    for seg, context in zip(prompt.segments, context_ids(prompt), strict=True):
        cid = segment_content_id(seg.ids, seg.segment.scope)
        if not store.contains_content(model_id, tokenizer_id, cid):
            continue
        if isinstance(store, FolderSegmentStore):  # the connector's: read without the K/V
            m = store.meta(model_id, tokenizer_id, cid)
            stored_after = None if m is None else m.context_id
        else:
            found = store.lookup_content(model_id, tokenizer_id, cid).kv
            stored_after = None if found is None else found.context_id
        if stored_after != context:
            return seg.start
    return None


@dataclass(frozen=True)
class Filled:
    """What a segment fill did: the strategy's stats, and the first token of the prompt whose
    K/V in the pages is not full recompute's (None: every token's is)."""

    stats: ReuseStats
    inexact_from: int | None


class SegmentFiller:
    """Fills a claimed span with an agentcache reuse strategy run on the same weights."""

    def __init__(
        self, model: LoadedModel, store: SegmentStore, max_tokens: int, default_strategy: str
    ) -> None:
        c = model.config
        pages = -(-max_tokens // 16) + 1
        pool = PagePool(PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, pages, 16))
        # the filled span is the plan's, chosen from the store's metadata: no update heads
        self.ctx = ReuseContext(model, store, pool, update_heads=False)
        self.default_strategy = default_strategy
        StrategySpec.parse(default_strategy)
        self._strategies: OrderedDict[str, ReuseStrategy] = OrderedDict()

    def strategy(self, spec: str | None) -> ReuseStrategy:
        """The strategy of a spec (`name` or `name:key=value...`), one instance per spec, the
        `MAX_STRATEGIES` most recently used kept (specs come with requests)."""
        spec = spec or self.default_strategy
        if spec not in self._strategies:
            self._strategies[spec] = StrategySpec.parse(spec).build()
            while len(self._strategies) > MAX_STRATEGIES:
                self._strategies.popitem(last=False)
        self._strategies.move_to_end(spec)
        return self._strategies[spec]

    def fill(
        self,
        kv: PagedKV,
        spec: RequestSpec,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        start: int,
        end: int,
    ) -> Filled:
        """Assemble the whole prompt's KV with the strategy and write tokens [start, end)."""
        prompt = spec.tokenized(token_ids)
        seq = SequenceKV(self.ctx.pool)
        try:
            with torch.inference_mode():
                pre = self.strategy(spec.strategy).prefill(self.ctx, prompt, seq)
                keys, values = seq.gather_all(slice(start, end))
            left = exact_left(seq)
            exact = prompt.num_tokens if left is None else left.exact_for(prompt)
            kv.write(block_ids, start, end, keys, values)
        finally:
            seq.free()
        # [0, start) is vLLM's own prefix hit (exact); the span was computed over the
        # strategy's K/V for it, exact only as far as the strategy's record says
        return Filled(pre.stats, None if exact >= end else max(exact, start))


@dataclass
class RunFill:
    """What loading a staged prefill's run did."""

    reused_tokens: int = 0
    failed_blocks: set[int] = field(default_factory=set)  # vLLM recomputes these
    misses: list[MissRow] = field(default_factory=list)


class StoredRunLoader:
    """Fills a staged prefill's claimed run with stored KV, keys re-rotated to the positions
    the run's tokens have now. Nothing is computed here (vLLM computes the rest)."""

    def __init__(
        self,
        store: SegmentStore,
        model_id: str,
        tokenizer_id: str,
        rope: RotaryEmbedding | LayerRotary,  # one for every layer, or each layer's own
    ) -> None:
        self.store = store
        self.model_id = model_id
        self.tokenizer_id = tokenizer_id
        self.rope = rope

    def fill(
        self,
        kv: PagedKV,
        spec: RequestSpec,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        start: int,
        end: int,
    ) -> RunFill:
        """Write tokens [start, end) from the stored segments covering them. A segment that
        is gone or fails its checksum leaves its blocks to vLLM (reported as load errors)."""
        out = RunFill()
        bs = kv.block_size
        for s in spec.spans:
            lo, hi = max(start, s.start), min(end, s.end)
            if lo >= hi:
                continue
            found = self.store.lookup_content(
                self.model_id, self.tokenizer_id, s.content_id(token_ids)
            )
            if found.kv is None or found.kv.num_tokens < hi - s.start:
                reason = str(found.miss or "other")
                out.misses.append((s.id, s.kind.value, s.end - s.start, reason))
                out.failed_blocks.update(block_ids[b] for b in range(lo // bs, (hi - 1) // bs + 1))
                continue
            a, b = lo - s.start, hi - s.start
            keys, values = found.kv.keys[:, a:b], found.kv.values[:, a:b]
            old, new = found.kv.positions[a:b], torch.arange(lo, hi)
            if not torch.equal(old, new):
                keys = self.rope.rerotate(keys, old, new)
            kv.write(block_ids, lo, hi, keys, values)
            out.reused_tokens += hi - lo
        return out
