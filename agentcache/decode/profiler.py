"""Head-stability profiler: dense greedy decode on sample prompts, recording each step's top-K
pages per (layer, KV head) by MinMax score, then RCO over windows (see profile.py).

It also measures, for each GQA combine ("sum", "max"), the attention recall of the selection:
the share of the dense attention mass of every query head that falls in the selected pages
(top-K + sink + newest), averaged over heads, layers and steps. Attention is the model's own
(`model.attention.attention_probs`: its softmax scale and each layer's sliding window), so the
profiled decode is the reference forward's (tests/decode/test_profiler.py).

`trace_heads` decodes after one prompt's prefilled K/V; `head_profile` turns the traces of
every prompt into a `HeadProfile`. The prefill is the caller's (`heads.run` runs the prompts
through the engine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from agentcache.decode.minmax import GQA_COMBINES, MinMaxMeta
from agentcache.decode.profile import (
    DEFAULT_UNSTABLE_FRACTION,
    DEFAULT_WINDOW,
    HeadProfile,
    unstable_set,
    window_rco,
)
from agentcache.model.attention import attention_probs, probs_attention
from agentcache.model.llama import LlamaForward
from agentcache.model.loading import LoadedModel

PAGE = 16


@dataclass(frozen=True)
class ProfileSettings:
    budget_pages: int = 64
    window: int = DEFAULT_WINDOW
    extra_windows: tuple[int, ...] = (4, 64)
    unstable_fraction: float = DEFAULT_UNSTABLE_FRACTION
    recent_pages: int = 1
    gqa_combine: str = "sum"  # the combine whose top-K sets are profiled
    steps: int = 128

    def __post_init__(self) -> None:
        if self.budget_pages < 1 or self.steps < 2 or self.window < 2:
            raise ValueError("budget_pages >= 1, steps >= 2 and window >= 2 are required")
        if self.gqa_combine not in GQA_COMBINES:
            raise ValueError(f"gqa_combine must be one of {GQA_COMBINES}")
        if not 0.0 <= self.unstable_fraction <= 1.0:
            raise ValueError(f"unstable_fraction must be in [0, 1], got {self.unstable_fraction}")

    def check_prompt(self, num_tokens: int) -> None:
        """ValueError unless a prompt of `num_tokens` has pages beyond the budget, the sink page
        and the recent pages (otherwise every page is always selected)."""
        if num_tokens // PAGE - 1 - self.recent_pages <= self.budget_pages:
            raise ValueError(
                f"profiling prompts need more than {self.budget_pages + 1 + self.recent_pages} "
                f"pages ({(self.budget_pages + 1 + self.recent_pages) * PAGE} tokens); got "
                f"{num_tokens} tokens"
            )


@dataclass
class HeadTrace:
    """One prompt's decode: per step the profiled top-K sets, the rankable pages and, per GQA
    combine, the attention recall of each layer's selection."""

    sets: list[Tensor]  # per step (L, Hkv, K) page ids
    candidates: list[int]  # per step, rankable pages
    recall: dict[str, list[float]]


def head_profile(
    model: LoadedModel, traces: list[HeadTrace], settings: ProfileSettings, prompt_tokens: list[int]
) -> HeadProfile:
    """`model`'s profile from `traces` (one per prompt, of `prompt_tokens` tokens each): window
    RCO averaged over prompts, the unstable set, mean GQA recall per combine."""
    if not traces:
        raise ValueError("a head profile needs at least one prompt's trace")
    c = model.config
    windows = (settings.window, *settings.extra_windows)
    totals = {w: torch.zeros(c.num_layers, c.num_kv_heads, dtype=torch.float64) for w in windows}
    recall: dict[str, list[float]] = {name: [] for name in GQA_COMBINES}
    for trace in traces:
        sets = torch.stack(trace.sets)
        for w in windows:
            totals[w] += window_rco(sets, trace.candidates, w) / len(traces)
        for name in GQA_COMBINES:
            recall[name] += trace.recall[name]
    stability = totals[settings.window]
    return HeadProfile(
        model_id=model.model_id,
        num_layers=c.num_layers,
        num_kv_heads=c.num_kv_heads,
        stability=stability.tolist(),
        unstable=unstable_set(stability, settings.unstable_fraction),
        rco_by_window={str(w): totals[w].tolist() for w in settings.extra_windows},
        gqa_recall={n: sum(r) / len(r) for n, r in recall.items()},
        settings={**asdict(settings), "prompts": len(traces), "prompt_tokens": prompt_tokens},
    )


def trace_heads(
    f: LlamaForward,
    keys: Tensor,
    values: Tensor,
    token: int,
    position: int,
    settings: ProfileSettings,
    on_step: Callable[[], None] | None = None,
) -> HeadTrace:
    """Dense greedy decode of `settings.steps` tokens after a prefill whose K/V are `keys`,
    `values` (L, T, Hkv, Dh) and whose next token is `token` at `position`; ValueError when T
    tokens leave no pages to rank beyond the budget (`ProfileSettings.check_prompt`)."""
    c = f.config
    t = keys.shape[1]
    settings.check_prompt(t)
    n_pages = -(-(t + settings.steps) // PAGE)
    kbuf = torch.zeros(c.num_layers, c.num_kv_heads, n_pages * PAGE, c.head_dim)
    vbuf = torch.zeros_like(kbuf)
    kbuf[:, :, :t], vbuf[:, :, :t] = keys.transpose(1, 2), values.transpose(1, 2)
    meta = MinMaxMeta(c.num_layers, c.num_kv_heads, c.head_dim, n_pages, PAGE)
    meta.build(keys)
    trace = HeadTrace([], [], {name: [] for name in GQA_COMBINES})
    group = c.num_heads // c.num_kv_heads
    with torch.inference_mode():
        for _ in range(settings.steps):
            hidden = f.embed(torch.tensor([token]))
            here = torch.tensor([t])  # the new token's index in the context
            pages = -(-(t + 1) // PAGE)
            tail = max(1, pages - settings.recent_pages)
            step_sets = []
            for layer in range(c.num_layers):
                q, k, v = f.project(layer, hidden, torch.tensor([position]))
                kbuf[layer, :, t], vbuf[layer, :, t] = k[0], v[0]
                meta.append(layer, k[0], t)
                qg = q[0].view(c.num_kv_heads, group, c.head_dim)
                keys_l = kbuf[layer, :, : t + 1].transpose(0, 1)  # (S, Hkv, Dh)
                # the model's own attention (its scale, this layer's window), weights kept
                probs = attention_probs(q, keys_l, here, f.scale, f.spec.window(layer))
                attn = probs_attention(probs, vbuf[layer, :, : t + 1].transpose(0, 1))
                mass = _page_mass(probs[0].view(c.num_kv_heads, group, -1), pages)  # (Hkv, G, P)
                for name in GQA_COMBINES:
                    top = _top(meta.scores(layer, qg, None, name), tail, settings.budget_pages)
                    trace.recall[name].append(_recall(mass, top, tail))
                    if name == settings.gqa_combine:
                        step_sets.append(top)
                hidden = f.finish(layer, hidden, attn)
            trace.sets.append(torch.stack(step_sets))
            trace.candidates.append(tail - 1)
            token = int(f.logits(hidden)[0].argmax())
            t, position = t + 1, position + 1
            if on_step:
                on_step()
    return trace


def _top(scores: Tensor, tail: int, budget: int) -> Tensor:
    """Top-`budget` rankable pages (1 .. tail-1) per head: (Hkv, K)."""
    return scores[:, 1:tail].topk(min(budget, tail - 1), dim=1).indices + 1


def _page_mass(probs: Tensor, pages: int) -> Tensor:
    hkv, g, n = probs.shape
    padded = torch.nn.functional.pad(probs, (0, pages * PAGE - n))
    return padded.view(hkv, g, pages, PAGE).sum(-1)


def _recall(mass: Tensor, top: Tensor, tail: int) -> float:
    kept = mass[:, :, 0] + mass[:, :, tail:].sum(-1)
    idx = top[:, None, :].expand(-1, mass.shape[1], -1)
    kept = kept + mass.gather(2, idx).sum(-1)
    return float(kept.mean())
