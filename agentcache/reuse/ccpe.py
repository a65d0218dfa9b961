"""CCPE (CacheSlide's Algorithm 1) on a CoPE model: the `cacheslide` position plan "ccpe".

A chunk's CoPE encoding is the contextual position, capped at P, of the prompt's first token
as seen from the chunk's first token: e = round(mean over heads of p_{s,0}) at layer 0.

    prompt   : [ system ][ update (any length) ][ fixed A ][ fixed B ][ update ][last]
    encoding :  e_sys      -                      e_A        e_B
    history  :  H[A] = {64: 5, 41: 1}  ->  e*[A] = 64 (most frequent over the task's prompts)
    this turn:  e_A == e*[A]  -> reuse A's cached K/V (it was computed at e*)
                e_A != e*[A]  -> recompute A at its live encoding (counted as a fallback)

Reading of the paper's "reuse chunks given e*, recompute chunks given live encodings": with CoPE
the encoding of a reused chunk lives in the K/V computed at it, not in a position id that could
be moved afterwards; a chunk is reused only where its live encoding is the task's e*, and
recomputed (live) otherwise. Once a chunk's context holds more than ~P gated tokens its encoding
saturates at P: shifting it further does not change what its tokens see, which is why CoPE
drifts less than RoPE. Every chunk's live encoding then joins the histogram (the "pre-training
phase" of Algorithm 1 runs online, over the turns this strategy instance serves).

At layer 0 a CoPE model that replaced RoPE has q/k that depend on the token alone, so the
encodings cost one Q/K projection of the prompt (counted in the stats).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentcache.errors import AgentCacheError
from agentcache.model.cope import CoPEForward
from agentcache.model.llama import LlamaForward
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import ReuseStats
from agentcache.reuse.positions import PLANS, BoundedCounts, PositionPlan, segment_key
from agentcache.reuse.segments import REUSABLE, SegmentHit


class CCPEError(AgentCacheError):
    """CCPE was selected for a model without CoPE attention."""


def chunk_encodings(forward: CoPEForward, ids: Sequence[int], starts: list[int]) -> list[int]:
    """CoPE encoding of the chunks starting at `starts` in the token sequence `ids`."""
    if not starts:
        return []
    n = max(starts) + 1
    hidden = forward.embed(torch.tensor(ids[:n], dtype=torch.int64))
    q, k, _ = forward.project(0, hidden, torch.arange(n))
    idx = torch.tensor(starts, dtype=torch.int64)
    p = forward.positions(0, q[idx], k, idx)  # (H, C, n)
    return [int(x) for x in p[:, :, 0].mean(dim=0).round().tolist()]


@PLANS.register("ccpe")
class CCPEPlan(PositionPlan):
    """Per-task histogram of chunk encodings (bounded) and the reuse decision it drives;
    every token keeps its index as position."""

    name = "ccpe"

    def __init__(self) -> None:
        self.histograms = BoundedCounts()

    def positions(self, prompt: TokenizedPrompt, hits: list[SegmentHit]) -> torch.Tensor:
        return torch.arange(prompt.num_tokens)

    def e_star(self, key: str) -> int | None:
        return self.histograms.most_frequent(key)

    def filter(
        self,
        forward: LlamaForward,
        model_id: str,
        prompt: TokenizedPrompt,
        hits: list[SegmentHit],
        stats: ReuseStats,
    ) -> list[SegmentHit]:
        """The hits to reuse: those whose live encoding is e*. Records this turn's encodings."""
        if not isinstance(forward, CoPEForward):
            raise CCPEError(
                f"plan 'ccpe' needs a CoPE model (load one with "
                f"agentcache.cope.checkpoint.load_cope_adapter); model {model_id!r} uses RoPE: "
                "use plan 'true' or 'mode'"
            )
        segments = [s for s in prompt.segments if s.kind in REUSABLE]
        encodings = chunk_encodings(forward, prompt.ids, [s.start for s in segments])
        if segments:  # one Q/K/V projection of layer 0 up to the last chunk start
            n = max(s.start for s in segments) + 1
            stats.token_layers_computed += forward.config.qkv_fraction() * n
        live = {segment_key(s): e for s, e in zip(segments, encodings, strict=True)}
        keep = []
        for h in hits:
            key = segment_key(h.segment)
            star = self.e_star(key)
            if star is None or live[key] == star:
                keep.append(h)
            else:
                stats.fallback(f"ccpe: chunk encoding {live[key]} != e* {star}, recomputed")
        for key, e in live.items():
            self.histograms.add(key, e)
        return keep
