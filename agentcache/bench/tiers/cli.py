"""`agentcache bench-tiers`: spill policies of the tiered KV store, side by side."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from agentcache.argtypes import non_negative_int, output_folder, path_arg, positive_int
from agentcache.bench.cli import select
from agentcache.bench.provenance import machine, provenance
from agentcache.bench.results import write_run
from agentcache.bench.reuse.report import markdown_table
from agentcache.bench.tiers.bench import TierBenchConfig, run_policy
from agentcache.bench.tiers.report import ratios, store_only_figure
from agentcache.errors import ConfigError
from agentcache.model.loading import load_model
from agentcache.progress import progress_bar

MiB = 1 << 20
COLUMNS = (
    ("write_amplification", "write amp.", "{:.2f}"),
    ("write_calls", "write calls", "{:d}"),
    ("disk_bytes_written", "MiB written", "{:.0f}"),
    ("disk_write_s", "write s", "{:.1f}"),
    ("disk_read_s", "read s", "{:.1f}"),
    ("dropped_clean", "clean drops", "{:d}"),
    ("disk_delta_pages", "delta pages", "{:d}"),
    ("ttft_disk_over_resident", "TTFT disk/resident", "{:.2f}"),
    ("throughput_turns_per_s", "turns/s", "{:.3f}"),
    ("throughput_std", "turns/s std", "{:.3f}"),
    ("warm_throughput_turns_per_s", "warm turns/s", "{:.3f}"),
    ("warm_throughput_std", "warm std", "{:.3f}"),
    ("load_overlap_mean", "load overlap", "{:.2f}"),
    ("store_only", "store-only turns/s", "{:.2f}"),
)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    about = "measure spill policies of the tiered KV store (write amplification, TTFT, throughput)"
    p = sub.add_parser("bench-tiers", help=about, description=about)
    p.add_argument("workloads", nargs="+", type=path_arg, help="JSON Lines workload files")
    p.add_argument("--policies", default="slide,lru", help="comma list of spill policies")
    p.add_argument("--batch", type=positive_int, default=8, help="concurrent sessions (default 8)")
    p.add_argument("--strategy", default="rpdc", help="reuse strategy (default rpdc)")
    p.add_argument("--kv-pages", type=positive_int, default=256,
                   help="fast pages per request (16 tokens)")  # fmt: skip
    p.add_argument("--fast-mib", type=non_negative_int, default=None,
                   help="fast tier (default or 0: one request)")  # fmt: skip
    p.add_argument("--host-mib", type=non_negative_int, default=0, help="host tier (default: none)")
    p.add_argument("--ttft-samples", type=non_negative_int, default=4,
                   help="turns timed disk vs resident")  # fmt: skip
    disk = "parent of the disk tier folders, created if missing (default: the temp folder)"
    p.add_argument("--disk-dir", type=path_arg, default=None, help=disk)
    p.add_argument("--out", type=path_arg, default=Path("bench-tiers-out"), help="output folder")
    p.add_argument("--max-sessions", type=positive_int, default=None, help="sessions per file")
    p.add_argument("--max-turns", type=positive_int, default=None, help="turns per session")
    p.add_argument("--case", default=None, help="only sessions of this case (swing / shift)")
    p.add_argument("--sessions", default=None, help="only these sessions (comma list of names)")
    p.add_argument("--new-tokens", type=positive_int, default=None, help="override max_new_tokens")
    p.add_argument("--no-adopt", dest="adopt", action="store_false",
                   help="keep stored segments as first computed: recomputed tokens make no "
                        "dirty pages (TierConfig.adopt_recomputed=False)")  # fmt: skip
    p.add_argument("--store-replays", type=non_negative_int, default=3,
                   help="replays of the rounds' store calls without the model, for the "
                        "store-only turns/s (median; default 3, 0: none)")  # fmt: skip
    p.add_argument("--save-traces", action="store_true",
                   help="save each policy's store trace to OUT/traces/ (for agentcache "
                        "replay-trace)")  # fmt: skip
    return p


def run(args: argparse.Namespace, model_path: str | None, cache_dir: Path) -> int:
    console = Console(stderr=True)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if not policies:
        raise ConfigError(f"--policies {args.policies!r} names no spill policy")
    cfg = TierBenchConfig(
        policies, args.batch, args.strategy, args.kv_pages,
        args.fast_mib * MiB if args.fast_mib else None, args.host_mib * MiB,
        args.ttft_samples, True, args.disk_dir, args.adopt, args.store_replays,
        args.out / "traces" if args.save_traces else None,
    )  # fmt: skip
    sessions, problems = select(args, console)
    if args.disk_dir is not None:
        output_folder(args.disk_dir, "--disk-dir")
    output_folder(args.out, "--out")
    model = load_model(model_path, cache_dir)
    # every turn, the TTFT samples, and the store replays
    per_policy = sum(len(s.turns) for s in sessions) + min(cfg.ttft_samples, len(sessions))
    per_policy += cfg.replays > 0
    results: dict[str, Any] = {}
    with progress_bar(console) as progress:
        task = progress.add_task("bench-tiers", total=per_policy * len(policies))
        for policy in policies:

            def advance(label: str, policy: str = policy) -> None:
                progress.update(task, advance=1, description=f"{policy} {label}")

            results[policy] = run_policy(model, sessions, policy, cfg, advance)
    out = write_tier_results(args.out, results, {
        "model": model.model_id,
        "command": "agentcache " + " ".join(sys.argv[1:]),
        "sessions": [s.name for s in sessions],
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "skipped_lines": problems,
    })  # fmt: skip
    print(table(out["policies"]))
    for line in warnings(out["policies"]):
        console.print(f"[yellow]warning:[/] {line}")
    print(f"\nwrote {args.out}/results.json, report.md and tiers.png")
    if cfg.trace_dir is not None:
        print(f"wrote the store traces to {cfg.trace_dir}/ (agentcache replay-trace reads them)")
    return 0


def write_tier_results(
    out: Path, per_policy: dict[str, Any], meta: dict[str, Any]
) -> dict[str, Any]:
    results = {
        "policies": per_policy,
        "vs_lru": ratios(per_policy),
        **meta,
        "machine": machine(),
        "provenance": provenance(split=meta.get("split"), sessions=meta.get("sessions", ())),
    }
    write_run(out, results, render)
    plot(results, out / "tiers.png")
    return results


def warnings(policies: dict[str, dict[str, Any]]) -> list[str]:
    """What went wrong in a run that still has figures: failed spills, a TTFT sampling cut
    short, a store replay that did not repeat the run."""
    out = []
    for name, p in policies.items():
        if p.get("failed_spills"):
            last = (p.get("tier_errors") or ["?"])[-1]
            out.append(f"{name}: {p['failed_spills']} spills failed (last: {last})")
        if p.get("ttft_error"):
            out.append(f"{name}: TTFT from disk not measured in full: {p['ttft_error']}")
        replayed = p.get("store_only")
        if replayed and not replayed["matches_run"]:
            differs = "; ".join(replayed["mismatches"][:3])
            out.append(f"{name}: the store replay differs from the run: {differs}")
    return out


def _cell(fmt: str, value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key == "disk_bytes_written":
        value = value / MiB
    if key == "store_only":  # the replay's rate; "!" where it did not repeat the run's writes
        return fmt.format(value["turns_per_s"]) + ("" if value["matches_run"] else " !")
    return fmt.format(value)


def table(policies: dict[str, dict[str, Any]]) -> str:
    rows = ([name, *(_cell(f, p.get(k), k) for k, _, f in COLUMNS)] for name, p in policies.items())
    return markdown_table(["policy", *(c[1] for c in COLUMNS)], rows)


def render(results: dict[str, Any]) -> str:
    parts = [
        "# agentcache bench-tiers report",
        "",
        f"Model `{results['model']}`; {results['machine']['cores']} cores, "
        f"{results['machine']['torch_threads']} torch threads; sessions: "
        f"{len(results['sessions'])}; config: `{results['config']}`.",
        "",
        f"Command: `{results['command']}`",
        "",
        "write amp. = bytes written to the disk tier (pages + journal) / K/V bytes the disk "
        "tier lacked when written (a page with no disk copy whole, a page whose disk copy is "
        "stale its stale token slots). delta pages = dirty pages written as a delta of those "
        "slots instead of whole. write s = seconds in the disk tier's file writes and fsyncs, "
        "read s = seconds in its page reads (checksums and deltas applied), over the rounds. "
        "TTFT disk/resident = median over sample turns of (prefill with every page on disk, OS "
        "cache dropped) / (same prefill, KV resident). turns/s over all rounds; std over rounds"
        " (one round = one turn of every session of the batch, run concurrently); warm: the "
        "same without each batch's first round, which has nothing to reuse and costs the same "
        "under every policy. load overlap = share of the per-layer KV load hidden behind "
        "compute. store-only turns/s = the rounds' store calls replayed on a fresh store "
        "without the model (one thread, synthetic K/V of the same shapes): the rate the store "
        "alone allows, the bound spill I/O sets when compute is fast (median of --store-replays"
        ' replays); "!" marks a replay whose disk writes differ from the run\'s. '
        "throughput_bound (below) = lru's rounds' seconds / the same less lru's store-only "
        "seconds: the turns/s ratio to lru of a policy whose store took no time at all, the "
        "most any spill policy can reach, since compute is the same under all.",
        "",
        table(results["policies"]),
        "",
    ]
    parts += [f"- **warning**: {w}" for w in warnings(results["policies"])]
    for name, r in results["vs_lru"].items():
        cells = ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in r.items())
        parts.append(f"- {name} vs lru: {cells}")
    parts += ["", "![tiers](tiers.png)"]
    return "\n".join(parts) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = results["policies"]
    names = list(policies)
    panels = (
        ("write_amplification", "write amplification"),
        ("write_calls", "disk write calls"),
        ("throughput_turns_per_s", "turns/s at batch, all / warm rounds (± std)"),
        ("ttft_disk_over_resident", "TTFT disk / resident"),
        ("store_only", "store-only turns/s, no model (± std)"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(17, 3.6))
    for ax, (key, title) in zip(axes, panels, strict=True):
        err: list[float] | None
        if key == "store_only":  # the replay's figures; 0 where the run had no replay
            values = [store_only_figure(policies[n], "turns_per_s") or 0.0 for n in names]
            err = [store_only_figure(policies[n], "throughput_std") or 0.0 for n in names]
        elif key == "throughput_turns_per_s":  # every round beside the warm rounds alone
            _throughput_bars(ax, policies, names)
            ax.set_title(title, fontsize=10)
            continue
        else:
            values = [policies[n].get(key) or 0.0 for n in names]
            err = None
        ax.bar(names, values, yerr=err, color="tab:blue", capsize=4)
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _throughput_bars(ax: Any, policies: dict[str, dict[str, Any]], names: list[str]) -> None:
    xs = range(len(names))
    for shift, key, std, label in (
        (-0.2, "throughput_turns_per_s", "throughput_std", "all rounds"),
        (0.2, "warm_throughput_turns_per_s", "warm_throughput_std", "warm rounds"),
    ):
        values = [policies[n].get(key) or 0.0 for n in names]
        err = [policies[n].get(std) or 0.0 for n in names]
        ax.bar([x + shift for x in xs], values, 0.4, yerr=err, capsize=4, label=label)
    ax.set_xticks(list(xs), names)
    ax.legend(fontsize=7)
