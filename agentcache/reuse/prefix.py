"""`prefix`: reuse the longest exact token prefix, in 16-token blocks (vLLM APC / SGLang radix).

Blocks are keyed by a hash chained over every token before them, so a block hits only when
the whole prefix up to it is identical: positions never move, reuse is exact. The chain starts
from the first segment's scope (`Segment.scope`), so prompts of different scopes (the server's
tenants and cache salts) never share a block, even for identical tokens.

    prompt : [blk0][blk1][blk2][blk3][..tail..]
    store  :  hit   hit   miss               -> reuse tokens [0, 32), compute [32, T)
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import StoredKV, chain_id
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    STRATEGIES,
    PlannedPrefill,
    PlanningStrategy,
    ReuseContext,
    ReuseStats,
    guarded,
)
from agentcache.reuse.guard import computed_cost, loaded

ROOT = "prefix-root"


def block_chain(ids: tuple[int, ...], block: int, scope: str | None = None) -> list[str]:
    """Chained content ids of every full block of `ids`, from the root of `scope`."""
    chain, prev = [], ROOT if scope is None else f"{ROOT}@{scope}"
    for start in range(0, len(ids) - block + 1, block):
        prev = chain_id(prev, ids[start : start + block])
        chain.append(prev)
    return chain


def chain_scope(prompt: TokenizedPrompt) -> str | None:
    """The scope a prompt's block chain starts from: its first segment's."""
    return prompt.segments[0].segment.scope if prompt.segments else None


def load_blocks(seq: SequenceKV, blocks: list[StoredKV], num_tokens: int) -> None:
    """Write the first `num_tokens` tokens of `blocks` (in order) into `seq`'s first slots,
    block by block (no concatenated copy)."""
    slots, start = seq.slots(), 0
    for b in blocks:
        n = min(b.num_tokens, num_tokens - start)
        if n <= 0:
            break
        seq.write_all(slots[start : start + n], b.keys[:, :n], b.values[:, :n])
        start += n


@STRATEGIES.register("prefix")
class PrefixReuse(PlanningStrategy):
    name = "prefix"

    def plan_prefill(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV
    ) -> PlannedPrefill:
        """Always up front: the matching blocks loaded, the tokens after them computed."""
        stats = ReuseStats(prompt.num_tokens, ctx.model.config.num_layers)
        t0 = time.perf_counter()
        blocks = self._matching_blocks(ctx, prompt)
        stats.lookup_s = time.perf_counter() - t0
        seq.extend(prompt.num_tokens)
        # the last prompt token is always computed: it produces the first output token
        num_reused = min(len(blocks) * ctx.pool.config.page_size, prompt.num_tokens - 1)
        computed = torch.arange(num_reused, prompt.num_tokens)
        layers = ctx.model.config.num_layers
        plan = computed_cost(computed, prompt.num_tokens, layers) + loaded(num_reused)
        if num_reused > 0 and guarded(ctx, prompt.num_tokens, plan, stats):
            num_reused, computed = 0, torch.arange(prompt.num_tokens)
        t1 = time.perf_counter()
        if num_reused > 0:
            load_blocks(seq, blocks, num_reused)
        stats.load_s = time.perf_counter() - t1
        stats.reused_tokens = stats.loaded_tokens = num_reused
        stats.reused = torch.arange(prompt.num_tokens) < num_reused  # exact: same tokens before
        stats.exact = stats.reused
        return PlannedPrefill(computed, torch.arange(prompt.num_tokens), stats)

    def _matching_blocks(self, ctx: ReuseContext, prompt: TokenizedPrompt) -> list[StoredKV]:
        m = ctx.model
        found = []
        for cid in block_chain(prompt.ids, ctx.pool.config.page_size, chain_scope(prompt)):
            hit = ctx.store.lookup_content(m.model_id, m.tokenizer.tokenizer_id, cid)
            if hit.kv is None:
                break
            found.append(hit.kv)
        return found

    def commit(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV, positions: Tensor
    ) -> None:
        m = ctx.model
        block = ctx.pool.config.page_size
        for i, cid in enumerate(block_chain(prompt.ids, block, chain_scope(prompt))):
            if ctx.store.contains_content(m.model_id, m.tokenizer.tokenizer_id, cid):
                continue
            span = slice(i * block, (i + 1) * block)
            if seq.holes is not None and bool(seq.holes[span].any()):
                continue  # a sliding-window layer holds no K/V for some of its tokens
            keys, values = seq.gather_all(span)
            kv = StoredKV(
                keys, values, positions[span].clone(), m.model_id, m.tokenizer.tokenizer_id
            )
            ctx.store.put_content(cid, kv)
