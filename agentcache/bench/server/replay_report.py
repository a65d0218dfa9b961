"""report.md and the throughput / p99 TTFT plot of a replay's results.json."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any


def _f(x: Any, unit: str = "", digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}{unit}"
    return f"{x}{unit}"


def _tenants(k: int) -> str:
    if k <= 1:
        return ""
    return (f" The sessions replay as {k} tenants in turn (session i sends cache_salt "
            f"`tenant-<i mod {k}>` to every target).")  # fmt: skip


def render(results: dict[str, Any]) -> str:
    """The report: the run's setting, then per target and N the medians over rounds, the
    ratios to the reference target within rounds, and the reply check."""
    cfg, prov, table = results["config"], results["provenance"], results["levels"]
    p = cfg["pauses"]
    lines = [
        "# Concurrent agents replaying workload sessions",
        "",
        f"Command: `{prov['command']}` (commit {prov['commit']}{' dirty' if prov['dirty'] else ''}"
        f", {prov['date']}).",
        "",
        f"Model `{cfg['model']}`; {len(results['sessions'])} sessions of `{cfg['workload']}` "
        f"(split {cfg['split']}), {results['turns_per_phase']} requests per phase, each greedy "
        f"and streamed. Tool pauses: log-normal, median {p['median_s']:g} s, sigma "
        f"{p['sigma']:g}, capped at {p['max_s']:g} s, seed {p['seed']} (drawn per session, the "
        f"same for every target and N; {p['total_s']:.3g} s in all, longest "
        f"{p['longest_s']:.3g} s). Targets {', '.join(cfg['targets'])}, each in a process of its "
        f"own, a fresh one per phase; {cfg['rounds']} round(s), the target order rotated per "
        f"round. Load average before {results['load_average']['before']}, after "
        f"{results['load_average']['after']}.{_tenants(cfg.get('tenants', 1))}"
        f"{_variants(cfg.get('target_args') or {})}",
        "",
        "Medians over rounds. Throughput: tokens per second of the phase's wall time (prompt: "
        "all prompt tokens; computed: prompt less cached). TTFT: client-measured time to the "
        "first streamed token; first turns are each session's turn 0, resumed turns follow a "
        "tool pause. JCT: a session's first request to its last reply, pauses included.",
        "",
        "| target | N | prompt tok/s | computed tok/s | decode tok/s | cached | TTFT first p50 / "
        "p99 | TTFT resumed p50 / p99 | server TTFT resumed p99 | JCT p50 | preempted | "
        "swapped | spilled | prefetched / promoted pages |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for target, levels in table.items():
        for n, c in levels.items():
            share = None if c["cached_share"] is None else 100 * c["cached_share"]
            lines.append(
                f"| {target} | {n} | {_f(c['prompt_tok_s'])} | {_f(c['computed_prompt_tok_s'])} | "
                f"{_f(c['decode_tok_s'])} | {_f(share, '%')} | {_f(c['ttft_first_p50_s'], ' s')} / "
                f"{_f(c['ttft_first_p99_s'], ' s')} | {_f(c['ttft_resumed_p50_s'], ' s')} / "
                f"{_f(c['ttft_resumed_p99_s'], ' s')} | {_f(c['server_ttft_resumed_p99_s'], ' s')} "
                f"| {_f(c['jct_p50_s'], ' s')} | {_f(c['preemptions'])} | "
                f"{_f(c['swapped_bytes'])} | {_f(c['spilled_bytes'])} | "
                f"{_f(c['prefetched_pages'])} / {_f(c['promoted_pages'])} |"
            )
    ref = cfg["targets"][0]
    if results["ratios"]:
        lines += ["", f"Ratios to `{ref}` in the same round and N (median over rounds):", "",
                  "| target | N | decode tok/s | prompt tok/s | TTFT first p99 | TTFT resumed p50 "
                  "| TTFT resumed p99 | JCT p50 |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for target, levels in results["ratios"].items():
            for n, r in levels.items():
                lines.append(
                    f"| {target} | {n} | {_f(r['decode_tok_s'], 'x')} | "
                    f"{_f(r['prompt_tok_s'], 'x')} | {_f(r['ttft_first_p99_s'], 'x')} | "
                    f"{_f(r.get('ttft_resumed_p50_s'), 'x')} | "
                    f"{_f(r['ttft_resumed_p99_s'], 'x')} | {_f(r['jct_p50_s'], 'x')} |"
                )
    lines += ["", "Greedy replies against the same session alone on the same target (summed "
              "over rounds):", "", "| target | N | compared | differing | failed requests |",
              "|---|---|---|---|---|"]  # fmt: skip
    for target, levels in table.items():
        for n, c in levels.items():
            failed = c["errors"]
            lines.append(f"| {target} | {n} | {c['replies_compared']} | "
                         f"{c['replies_differing']} | {failed} of {c['requests']} |")  # fmt: skip
    lines += ["", "![throughput and p99 TTFT against N](replay.png)", "",
              "Every request's record, the pauses and the solo replies are in results.json; "
              "the servers' output in servers.log."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _variants(target_args: dict[str, list[str]]) -> str:
    """The targets run with more server arguments, as a sentence (empty when none)."""
    if not target_args:
        return ""
    named = "; ".join(f"`{label}`: `{shlex.join(a)}`" for label, a in target_args.items())
    return f" Server arguments added per target: {named}."


def plot(results: dict[str, Any], path: Path) -> None:
    """Decode and prompt tokens/s, and p99 TTFT of resumed and first turns, against N (both
    axes logarithmic), one colour per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, ttft) = plt.subplots(1, 2, figsize=(10, 3.8))
    levels_n: set[int] = set()
    for target, levels in results["levels"].items():
        ns = [int(n) for n in levels]
        levels_n.update(ns)
        cells = list(levels.values())

        def series(key: str, cells: list[dict[str, Any]] = cells) -> list[float]:
            return [float("nan") if c[key] is None else c[key] for c in cells]

        (line,) = tput.plot(ns, series("decode_tok_s"), "o-", label=f"{target} decode")
        tput.plot(ns, series("prompt_tok_s"), "s--", color=line.get_color(),
                  label=f"{target} prompt", alpha=0.7)  # fmt: skip
        ttft.plot(ns, series("ttft_resumed_p99_s"), "o-", color=line.get_color(),
                  label=f"{target} resumed")  # fmt: skip
        ttft.plot(ns, series("ttft_first_p99_s"), "s--", color=line.get_color(),
                  label=f"{target} first", alpha=0.7)  # fmt: skip
    for ax, title, unit in ((tput, "aggregate throughput", "tokens / s"),
                            (ttft, "p99 time to first token", "seconds")):  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(levels_n), [str(n) for n in sorted(levels_n)])
        ax.set_yscale("log")  # decode and prompt rates differ by orders of magnitude
        ax.set_xlabel("concurrent agents (N)")
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
