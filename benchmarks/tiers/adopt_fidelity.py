"""Does writing recomputed tokens back into the stored segments help the next turns?

With a tiered store and `TierConfig.adopt_recomputed` (the default), the K/V a selective
strategy recomputes inside a reused segment replaces the stored copy of that segment's page
(a dirty page, which must be written to disk before it can leave the fast tier). Without it
the store keeps each segment's first copy and the page stays clean. This script runs the same
sessions through `agentcache bench`'s harness with the strategy on the plain store (label
`STRATEGY`) and on a tiered store that adopts (label `STRATEGY+adopt`, fast tier large enough
that nothing spills), and reports fidelity against full recompute for each. Turns 0 and 1 are
the same in both (nothing adopted is reused before turn 2); the comparison (`adopt.md`) is over
turns 2 and later, per workload and over all.

    python benchmarks/tiers/adopt_fidelity.py \
        benchmarks/workloads/{reflexion,memgpt,swe_agent}.jsonl \
        --sessions reflexion-01,reflexion-02,memgpt-01,memgpt-02,swe_agent-01,swe_agent-02 \
        --out docs/bench/adopt/a
    python benchmarks/tiers/adopt_fidelity.py --summary docs/bench/adopt/*/results.json \
        --out docs/bench/adopt
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentcache.argtypes import positive_int
from agentcache.bench.cli import select
from agentcache.bench.reuse.harness import BenchRunner, StrategySpec
from agentcache.bench.reuse.report import table, write_results
from agentcache.errors import AgentCacheError
from agentcache.model.loading import load_model
from agentcache.runtime.engine import EngineConfig
from agentcache.tiers.config import TierConfig
from agentcache.units import GiB

ADOPT = "+adopt"


class AdoptRunner(BenchRunner):
    def engine_config(self, spec: StrategySpec) -> EngineConfig:
        config = super().engine_config(spec)
        if not spec.label.endswith(ADOPT):
            return config
        return replace(config, tiers=TierConfig(fast_bytes=8 * GiB, adopt_recomputed=True))


def compare(records: list[dict[str, Any]], strategy: str) -> str:
    """Markdown: `strategy` vs `strategy+adopt` on turns >= 2, per workload and over all."""
    pairs: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    by_turn = {(r["session"], r["turn"], r["strategy"]): r for r in records}
    for (session, turn, label), plain in sorted(by_turn.items()):
        adopted = by_turn.get((session, turn, label + ADOPT))
        if label == strategy and turn >= 2 and adopted is not None:
            pairs[plain["workload"]].append((plain, adopted))
            pairs["all"].append((plain, adopted))
    rows = [
        "| workload | turns | KL first (plain / adopt) | KL tf (plain / adopt) "
        "| greedy exact (plain / adopt) | turns adopt lower KL tf | KL tf adopt/plain (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, ps in sorted(pairs.items(), key=lambda kv: (kv[0] == "all", kv[0])):

        def mean(key: str, side: int, ps: list[Any] = ps) -> float:
            return statistics.mean(float(p[side][key]) for p in ps)

        better = sum(b["tf_kl"] < a["tf_kl"] for a, b in ps)
        ratios = [b["tf_kl"] / a["tf_kl"] for a, b in ps if a["tf_kl"] > 0]
        ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
        rows.append(
            f"| {name} | {len(ps)} | {mean('kl_first_token', 0):.2e} / "
            f"{mean('kl_first_token', 1):.2e} | {mean('tf_kl', 0):.2e} / {mean('tf_kl', 1):.2e} "
            f"| {mean('greedy_exact_match', 0):.2f} / {mean('greedy_exact_match', 1):.2f} "
            f"| {better} of {len(ps)} | {ratio} |"
        )
    return "\n".join(rows) + "\n"


def summary(files: list[Path], out: Path) -> int:
    records: list[dict[str, Any]] = []
    strategy = ""
    for f in files:
        saved = json.loads(f.read_text())
        records += saved["turns"]
        strategy = next(s for s in saved["strategies"] if s != "full" and not s.endswith(ADOPT))
    out.mkdir(parents=True, exist_ok=True)
    write_compare(records, strategy, out)
    return 0


def write_compare(records: list[dict[str, Any]], strategy: str, out: Path) -> None:
    text = compare(records, strategy)
    (out / "adopt.md").write_text(text)
    print(text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workloads", nargs="*", type=Path)
    p.add_argument("--summary", nargs="+", type=Path, default=None,
                   help="only compare these results.json files (runs of this script)")  # fmt: skip
    p.add_argument("--sessions", default="", help="comma list of session names")
    p.add_argument("--strategy", default="rpdc", help="strategy spec (default rpdc)")
    p.add_argument("--max-turns", type=positive_int, default=None, help="turns per session")
    p.add_argument("--new-tokens", type=positive_int, default=16)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(case=None, max_sessions=None)  # what `select` reads besides the above
    args = p.parse_args()
    if args.summary:
        return summary(args.summary, args.out)
    if not args.workloads or not args.sessions:
        p.error("give workload files and --sessions (or --summary FILES)")
    console = Console(stderr=True)
    try:
        chosen, problems = select(args, console)
    except AgentCacheError as e:
        p.error(str(e))
    base = StrategySpec.parse(args.strategy)
    specs = [StrategySpec("full", "full"), base,
             StrategySpec(base.label + ADOPT, base.name, base.options)]  # fmt: skip
    model = load_model()
    runner = AdoptRunner(model, specs)
    records: list[dict[str, Any]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:  # fmt: skip
        task = progress.add_task("adopt", total=sum(len(s.turns) for s in chosen) * len(specs))
        for s in chosen:

            def advance(label: str, name: str = s.name) -> None:
                progress.update(task, advance=1, description=f"{name} {label}")

            records += runner.run_session(s, advance)
    meta = {"model": model.model_id, "command": "python " + " ".join(sys.argv),
            "sessions": [s.name for s in chosen]}  # fmt: skip
    results = write_results(args.out, records, meta, problems)
    print(table(results["strategies"]))
    write_compare(records, base.label, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
