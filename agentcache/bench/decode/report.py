"""results.json, report.md and PNG plots for `agentcache bench-decode`; the report of
`agentcache bench-dense-decode`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentcache.bench.results import write_run
from agentcache.bench.reuse.report import markdown_table

COLUMNS = (
    ("fast_tier_kv_ratio_vs_dense", "fast KV / dense", "{:.3f}"),
    ("fast_tier_total_ratio_vs_dense", "+ metadata", "{:.3f}"),
    ("decode_tokens_per_s", "tok/s", "{:.2f}"),
    ("decode_speed_ratio_vs_dense", "speed / dense", "{:.2f}"),
    ("speed_ratio_median", "steady-state speed / dense, median over prompts", "{:.2f}"),
    ("speed_ratio_min", "min", "{:.2f}"),
    ("speed_ratio_max", "max", "{:.2f}"),
    ("speed_with_setup_ratio_median", "with set-up, median", "{:.2f}"),
    ("prompts_identical_to_dense", "prompts = dense", "{}"),
    ("greedy_agreement_with_dense", "greedy agree", "{:.3f}"),
    ("greedy_agree_prefix_mean", "agree prefix", "{:.0f}"),
    ("teacher_forced_top1_agreement", "tf top1", "{:.3f}"),
    ("teacher_forced_top1_min", "tf top1 min", "{:.3f}"),
    ("needle_prompts_found", "needles found", "{}"),
    ("verify_acceptance", "draft accept", "{:.3f}"),
    ("verify_passes_per_token", "dense passes/token", "{:.3f}"),
    ("bytes_promoted_per_rerank", "promoted B/rerank", "{:.3g}"),
    ("rerank_ms_per_step", "rerank ms/step", "{:.2f}"),
    ("head_reranks_per_step", "head reranks/step", "{:.1f}"),
    ("top_pages_per_rerank", "top pages/rerank", "{:.1f}"),
    ("setup_ms_mean", "setup ms", "{:.0f}"),
)


def table(policies: dict[str, dict[str, Any]]) -> str:
    rows = (
        [name, *(fmt.format(s[k]) if k in s else "-" for k, _, fmt in COLUMNS)]
        for name, s in policies.items()
    )
    return markdown_table(["policy", *(c[1] for c in COLUMNS)], rows)


def write_report(out: Path, results: dict[str, Any]) -> None:
    write_run(out, results, render_markdown)
    plot(results, out)


def render_markdown(results: dict[str, Any]) -> str:
    st = results["settings"]
    m = results["machine"]
    return "\n".join([
        "# agentcache bench-decode report",
        "",
        f"Model `{results['model']}`; context {st['context']} tokens "
        f"({st['prompt_tokens']} prompt + {st['new_tokens']} generated), "
        f"{results['num_prompts']} prompt(s), budget {st['budget_pages']} pages per KV head, "
        f"GQA combine `{st['gqa_combine']}`; {m['cores']} cores, {m['torch_threads']} torch "
        "threads.",
        "",
        f"Command: `{results['command']}`",
        "",
        "fast KV / dense: fast-tier KV bytes (allocated head-pages) over dense's pages for the "
        "same tokens; + metadata adds the MinMax metadata. tok/s: generated tokens / decode time. "
        "greedy "
        "agree: fraction of the generated tokens equal to dense's at the same position "
        "(free-running); tf top1: argmax agreement when fed dense's tokens. promoted B/rerank: "
        "host->fast bytes per step in which offloaded heads reranked (first step excluded). "
        "draft accept: with verify=K, drafted tokens the dense pass kept; dense passes/token: "
        "dense verification passes per generated token.",
        "",
        table(results["policies"]),
        "",
        *_needle_lines(results),
        "![decode](decode.png)",
        "",
    ])  # fmt: skip


def _needle_lines(results: dict[str, Any]) -> list[str]:
    needle = results.get("needle")
    if not needle:
        return []
    lines = [
        f"Planted needle: `{needle['needle']}` halfway into the context; greedy answers:",
        "",
        "| policy | answer | secret found | same as dense |",
        "|---|---|---|---|",
    ]
    for name, rec in needle["policies"].items():
        answer = rec["answer"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {name} | `{answer}` | {rec['found']} | {rec['same_as_dense']} |")
    return [*lines, ""]


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pol = results["policies"]
    names = list(pol)
    panels = (
        ("fast_tier_kv_ratio_vs_dense", "fast-tier KV / dense (lower is better)"),
        ("decode_speed_ratio_vs_dense", "decode speed / dense (higher is better)"),
        ("greedy_agreement_with_dense", "greedy agreement with dense"),
        ("rerank_ms_per_step", "rerank ms per step"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.bar(names, [pol[n].get(key, 0.0) for n in names], color="tab:blue")
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        if "ratio" in key or "agreement" in key:
            ax.axhline(1.0, color="gray", lw=0.8)
    fig.suptitle(f"Decode policies at {results['settings']['context']} tokens", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "decode.png", dpi=120)
    plt.close(fig)


def dense_table(contexts: dict[str, Any]) -> str:
    header = [
        "context", "engine tok/s", "gather tok/s", "transformers tok/s",
        "engine / transformers (min)", "engine / gather (min)", "same tokens as engine",
    ]  # fmt: skip
    rows = []
    for context, rec in contexts.items():
        s = rec["summary"]
        e, g, t = s["engine"], s["gather"], s["transformers"]
        rows.append([
            context, f"{e['tokens_per_s_median']:.2f}", f"{g['tokens_per_s_median']:.2f}",
            f"{t['tokens_per_s_median']:.2f}",
            f"{t['engine_speedup_median']:.2f} ({t['engine_speedup_min']:.2f})",
            f"{g['engine_speedup_median']:.2f} ({g['engine_speedup_min']:.2f})",
            f"gather {g['greedy_agreement_with_engine']:.3f}, "
            f"transformers {t['greedy_agreement_with_engine']:.3f}",
        ])  # fmt: skip
    return markdown_table(header, rows)


def render_dense(results: dict[str, Any]) -> str:
    st, m = results["settings"], results["machine"]
    return "\n".join([
        "# agentcache bench-dense-decode report",
        "",
        f"Model `{results['model']}`; {st['num_prompts']} prompt(s) per context, "
        f"{st['new_tokens']} greedy tokens each; {m['cores']} cores, {m['torch_threads']} torch "
        "threads.",
        "",
        f"Command: `{results['command']}`",
        "",
        "tok/s: medians over prompts of (new tokens - 1) / decode time after the first token. "
        "Ratios: per prompt within the run, median (min) over prompts. engine: the page pool "
        "read in place; gather: the reference path copying the context each layer and step; "
        "transformers: `generate` with its default cache.",
        "",
        dense_table(results["contexts"]),
        "",
    ])  # fmt: skip
