"""Fidelity measures against `full` and their aggregation."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor


def kl(ref: Tensor, other: Tensor) -> Tensor:
    """KL(ref || other) over the last dim of two logit tensors (..., V) -> (...)."""
    p = torch.log_softmax(ref.double(), -1)
    q = torch.log_softmax(other.double(), -1)
    return (p.exp() * (p - q)).sum(-1)


def fidelity(ref_logits: Tensor, ref_tokens: Sequence[int], logits: Tensor) -> dict[str, float]:
    """ref_logits/logits (n, V): teacher-forced along `full`'s greedy tokens (n,)."""
    n = len(ref_tokens)
    ref = torch.tensor(ref_tokens)
    argmax = logits.argmax(-1)
    agree = (argmax == ref).tolist()
    prefix = next((i for i, a in enumerate(agree) if not a), n)
    top5_ref = set(ref_logits[0].topk(5).indices.tolist())
    top5 = set(logits[0].topk(5).indices.tolist())
    return {
        "kl_first_token": float(kl(ref_logits[0], logits[0])),
        "first_token_agreement": float(agree[0]),
        "top5_overlap": len(top5_ref & top5) / 5,
        "tf_kl": float(kl(ref_logits, logits).mean()),
        "tf_top1_agreement": sum(agree) / n,
        "greedy_exact_match": float(prefix == n),
        "greedy_agree_prefix": float(prefix),
    }


def cksim_by_layer(
    ref_keys: Tensor, keys: Tensor, windows: Sequence[int | None] | None = None
) -> list[float]:
    """Mean cosine (over tokens and heads) of keys vs `full`'s keys, per layer. (L, T, H, D).

    On a sliding-window layer (`windows[l]` = W) only the keys later tokens read count: the
    last W - 1 prompt tokens (the next token sees those and itself). The rows before them are
    read by no later query, and a strategy need not even load them (reuse/windowed.py: the
    sequence holds no K/V there), so comparing them would measure whatever the pages held."""
    cos = torch.nn.functional.cosine_similarity(ref_keys, keys, dim=-1)  # (L, T, H)
    if windows is None:
        return cos.mean(dim=(1, 2)).tolist()
    if len(windows) != cos.shape[0]:
        raise ValueError(f"{len(windows)} layer windows for keys of {cos.shape[0]} layers")
    t = cos.shape[1]
    return [
        float(c.mean() if w is None else c[max(0, t - (w - 1)) :].mean())
        for c, w in zip(cos, windows, strict=True)
    ]


def _median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.fmean(xs) if xs else float("nan")


def aggregate(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per-strategy summary over turn records of one strategy."""
    return {
        "ttft_ms_median": _median(r["ttft_ms"] for r in records),
        "ttft_ratio_vs_full": _median(r["ttft_ms"] / r["ttft_full_ms"] for r in records),
        "ttft_ratio_vs_limit": _median(r["ttft_ms"] / r["ttft_limit_ms"] for r in records),
        "first_token_agreement": _mean(r["first_token_agreement"] for r in records),
        "greedy_exact_match": _mean(r["greedy_exact_match"] for r in records),
        "greedy_agree_prefix_mean": _mean(r["greedy_agree_prefix"] for r in records),
        "kl_first_token_mean": _mean(r["kl_first_token"] for r in records),
        "tf_kl_mean": _mean(r["tf_kl"] for r in records),
        "tf_top1_agreement": _mean(r["tf_top1_agreement"] for r in records),
        "top5_overlap_mean": _mean(r["top5_overlap"] for r in records),
        "recompute_fraction_mean": _mean(r["recompute_fraction"] for r in records),
        "reused_fraction_mean": _mean(r["reused_tokens"] / r["prompt_tokens"] for r in records),
        "fast_tier_kv_bytes_peak": max(r["fast_tier_kv_bytes_peak"] for r in records),
        "store_bytes_peak": max(r["store_bytes_peak"] for r in records),
        "fallbacks": sum(r["fallbacks"] for r in records),
        # turns where a probe strategy computed every candidate (records before it: absent)
        "probe_skipped_turns": sum(bool(r.get("probe_skipped")) for r in records),
        # chat turns whose reply KV could not be stored as the server stores it (ReplyKV)
        "reply_kv_not_stored": sum(r.get("reply_kv") not in (None, "stored") for r in records),
        "turns": len(records),
    }
