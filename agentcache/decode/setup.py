"""Resolve an engine's decode configuration into a plan: policy, head profile, fallback."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from agentcache.decode.base import Decoder
from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import PAGE_TOKENS, SparseDecoder, rankable_pages
from agentcache.decode.policies import DECODE_POLICIES, Dense, HeadPlan
from agentcache.decode.profile import HeadProfile, load_profile, profile_filename
from agentcache.decode.verified import VerifiedDecoder
from agentcache.errors import ProfileError
from agentcache.kv.pool import SequenceKV
from agentcache.model.families.base import SPARSE_DECODE
from agentcache.model.loading import LoadedModel, default_cache_dir


def profile_path(config: DecodeConfig, model_id: str) -> Path:
    if config.profile is not None:
        return config.profile
    folder = config.profile_dir or default_cache_dir() / "profiles"
    return folder / profile_filename(model_id)


@dataclass(frozen=True)
class DecodeSetup:
    policy: str  # the policy in use (dense after a fallback)
    plan: HeadPlan
    config: DecodeConfig
    fallback_reason: str | None  # why the configured policy was replaced by dense

    @classmethod
    def resolve(cls, model: LoadedModel, config: DecodeConfig) -> DecodeSetup:
        c = model.config
        policy = DECODE_POLICIES.get(config.policy)(**config.policy_options)
        if policy.name != "dense":  # a family that cannot decode sparsely is refused up front
            model.forward.require(SPARSE_DECODE)
        profile: HeadProfile | None = None
        if policy.needs_profile:
            path = profile_path(config, model.model_id)
            try:
                profile = load_profile(path, model.model_id, c.num_layers, c.num_kv_heads)
            except ProfileError as e:
                if not config.dense_fallback:
                    raise
                warnings.warn(f"{e}; decoding densely (dense_fallback)", stacklevel=2)
                plan = Dense().plan(c.num_layers, c.num_kv_heads, None)
                return cls("dense", plan, config, str(e))
        return cls(policy.name, policy.plan(c.num_layers, c.num_kv_heads, profile), config, None)

    def decoder(
        self, model: LoadedModel, seq: SequenceKV, max_new_tokens: int, greedy: bool, dense: Decoder
    ) -> Decoder:
        """The decoder of one turn after prefill into `seq`: `sparse_decoder`, then `adopt`."""
        sparse = self.sparse_decoder(model, seq, max_new_tokens)
        return self.adopt(model, seq, greedy, dense, sparse)

    def sparse_decoder(
        self, model: LoadedModel, seq: SequenceKV, max_new_tokens: int
    ) -> SparseDecoder | None:
        """The sparse decoder of one turn after prefill into `seq`, its KV copied from `seq`'s
        pages; None when the plan is dense or no step will run (fewer than two new tokens).
        It reads `seq` and writes nothing shared, so it may run while other turns step, as
        long as nothing else writes `seq` (the engine runs it outside its lock)."""
        if not self.plan.sparse or max_new_tokens <= 1:
            return None
        if self.short_reason(seq.num_tokens, max_new_tokens) is not None:
            return None
        max_tokens = seq.num_tokens + max_new_tokens
        with torch.inference_mode():  # the pool's pages read in place where they lie in order
            keys, values = seq.read_all(slice(0, seq.num_tokens))
            return SparseDecoder(model.forward, self.plan, self.config, keys, values, max_tokens)

    def short_reason(self, prompt_tokens: int, max_new_tokens: int) -> str | None:
        """Why a turn of `prompt_tokens` and up to `max_new_tokens` decodes densely under this
        sparse plan (`DecodeConfig.short_dense`): its sparse decoder would attend every page of
        every head at every step and offload none (the budget covers every page it can rank,
        top_p keeps the whole budget, no streaming head's window leaves a page out), so it
        would pay its set-up and bookkeeping for dense decoding's attention. None when some
        page could be left out, when no sparse step runs, or when `short_dense` is off."""
        c = self.config
        if not self.plan.sparse or max_new_tokens <= 1 or not c.short_dense or c.top_p < 1.0:
            return None
        pages = -(-(prompt_tokens + max_new_tokens) // PAGE_TOKENS)
        most = rankable_pages(pages, c.recent_pages)
        streaming = self.plan.streaming
        if streaming is not None and bool(streaming.any()) and 1 + self.plan.window_pages < pages:
            return None
        if c.budget_pages < most:
            return None
        return (
            f"short: {prompt_tokens} + {max_new_tokens} tokens fill {pages} pages, every one "
            f"within the budget of {c.budget_pages} (a sparse decoder would attend them all)"
        )

    def adopt(
        self, model: LoadedModel, seq: SequenceKV, greedy: bool, dense: Decoder,
        sparse: SparseDecoder | None,
    ) -> Decoder:  # fmt: skip
        """The turn's decoder, `sparse` that `sparse_decoder` built for `seq`: `dense` when it
        is None. Else `seq` is freed down to the pages its fast tier (arena of head-pages and
        page metadata) would fill (`fast_tier_pages`; fewer where the pool has fewer free, as
        when a policy keeps every head whole and a short prompt asks many new tokens), which
        `seq` holds, unwritten, until the turn ends: the pool's bound
        (`EngineConfig.kv_bytes`) counts a sparse turn by its fast tier as it counts a dense
        turn by its pages, so what offloading saves is room for more turns. It is verified
        when configured and decoding is `greedy` (the engine's: greedy with no token
        constraint), else a configured verification is reported skipped. Changes the pool:
        under the engine's lock."""
        if sparse is None:
            return dense
        seq.free()
        seq.reserve(fast_tier_pages(sparse, seq.pool.config.page_bytes))
        if not self.config.verify:
            return sparse
        if not greedy:
            sparse.verify_skipped = True
            return sparse
        return VerifiedDecoder(sparse, self.config.verify, model.tokenizer.eos_token_ids)


def fast_tier_pages(decoder: SparseDecoder, page_bytes: int) -> int:
    """Pool pages (of `page_bytes`) as many bytes as `decoder`'s fast tier holds: its arena of
    head-pages and its pages' metadata; the host tier's copy is not counted."""
    return -(-(decoder.kv.fast_tier_bytes + decoder.meta.nbytes) // page_bytes)
