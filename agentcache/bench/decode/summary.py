"""bench-decode's per-policy summary of the per-prompt records (see `bench.decode.bench`)."""

from __future__ import annotations

import statistics
from typing import Any


def summarize(
    per_prompt: list[dict[str, Any]], policies: tuple[str, ...], teacher_forced: bool
) -> dict[str, Any]:
    """Per policy: means over prompts (speeds pooled over every step), then `_spread`."""

    def pooled(name: str, key: str) -> list[Any]:
        return [p["policies"][name][key] for p in per_prompt]

    def runs_of(name: str) -> dict[str, Any]:
        return per_prompt[0]["policies"][name]

    def decode_sum(name: str, key: str) -> float:
        return sum(float(d[key]) for d in pooled(name, "decode") if d)

    def per_token(name: str) -> float:  # decode seconds per generated token after the first
        runs = pooled(name, "step_s")
        return sum(sum(r) for r in runs) / sum(len(t) - 1 for t in pooled(name, "tokens"))

    out: dict[str, Any] = {}
    dense_token = per_token("dense")
    dense_bytes = statistics.mean(pooled("dense", "fast_tier_kv_bytes"))
    every_head = None
    for name in policies:
        token_s = per_token(name)
        kv_bytes = statistics.mean(pooled(name, "fast_tier_kv_bytes"))
        meta = statistics.mean(pooled(name, "metadata_bytes"))
        steps = sum(len(t) - 1 for t in pooled(name, "tokens"))
        rerank_steps = decode_sum(name, "rerank_steps")
        s: dict[str, Any] = {
            "fast_tier_kv_bytes": kv_bytes,
            "fast_tier_kv_ratio_vs_dense": kv_bytes / dense_bytes,
            "fast_tier_kv_reduction": 1.0 - kv_bytes / dense_bytes,
            "fast_tier_metadata_bytes": meta,
            "fast_tier_total_ratio_vs_dense": (kv_bytes + meta) / dense_bytes,
            "decode_tokens_per_s": 1.0 / token_s,
            "decode_speed_ratio_vs_dense": dense_token / token_s,
            "decode_ms_per_token": 1000 * token_s,
            "setup_ms_mean": 1000 * statistics.mean(pooled(name, "setup_s")),
            "greedy_agreement_with_dense": statistics.mean(
                pooled(name, "greedy_agreement_with_dense")
            ),
            "greedy_agree_prefix_mean": statistics.mean(pooled(name, "greedy_agree_prefix")),
            "bytes_promoted_per_rerank": (
                decode_sum(name, "bytes_promoted") / rerank_steps if rerank_steps else 0.0
            ),
            "rerank_ms_per_step": 1000 * decode_sum(name, "rerank_s") / steps,
            "head_reranks_per_step": decode_sum(name, "head_reranks") / steps,
            "top_pages_per_rerank": (
                decode_sum(name, "selected_pages") / decode_sum(name, "head_reranks")
                if decode_sum(name, "head_reranks")
                else 0.0
            ),
        }
        if decode_sum(name, "drafted_tokens"):
            s["verify_acceptance"] = decode_sum(name, "accepted_tokens") / decode_sum(
                name, "drafted_tokens"
            )
            s["verify_passes_per_token"] = decode_sum(name, "verify_passes") / steps
            s["host_bytes_read_per_token"] = decode_sum(name, "host_bytes_read") / steps
        s.update(_spread(per_prompt, name))
        if teacher_forced and "teacher_forced_top1_agreement" in runs_of(name):
            s["teacher_forced_top1_agreement"] = statistics.mean(
                pooled(name, "teacher_forced_top1_agreement")
            )
        if name == "quest":
            every_head = s["rerank_ms_per_step"]
        out[name] = s
    for s in out.values():
        if every_head and s["rerank_ms_per_step"]:
            s["rerank_speedup_vs_every_head_every_step"] = every_head / s["rerank_ms_per_step"]
    return out


def _spread(per_prompt: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Median and range over prompts of the per-prompt speed ratio to dense (both timed on
    the same prompt), in steady state and with each decoder's set-up added to its steps, the
    prompts decoded exactly as dense, and needles found."""

    def speed(rec: dict[str, Any], setup: bool = False) -> float:
        return (len(rec["tokens"]) - 1) / (sum(rec["step_s"]) + (rec["setup_s"] if setup else 0))

    ratios = [speed(p["policies"][name]) / speed(p["policies"]["dense"]) for p in per_prompt]
    with_setup = [
        speed(p["policies"][name], True) / speed(p["policies"]["dense"], True) for p in per_prompt
    ]
    recs = [p["policies"][name] for p in per_prompt]
    out: dict[str, Any] = {
        "speed_ratio_median": statistics.median(ratios),
        "speed_ratio_min": min(ratios),
        "speed_ratio_max": max(ratios),
        "speed_with_setup_ratio_median": statistics.median(with_setup),
        "speed_with_setup_ratio_min": min(with_setup),
        "speed_with_setup_ratio_max": max(with_setup),
        "prompts": len(recs),
        "prompts_identical_to_dense": sum(r["greedy_agreement_with_dense"] == 1.0 for r in recs),
    }
    needles = [r["needle_found"] for r in recs if "needle_found" in r]
    if needles:
        out["needle_prompts_found"] = f"{sum(needles)}/{len(needles)}"
    tf = [r["teacher_forced_top1_agreement"] for r in recs if "teacher_forced_top1_agreement" in r]
    if tf:
        out["teacher_forced_top1_min"] = min(tf)
    return out
