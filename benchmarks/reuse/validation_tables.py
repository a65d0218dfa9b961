#!/usr/bin/env python3
"""The validation tables of docs/benchmarks.md, from bench runs' results.json: one table per
run (warm turns, every strategy), with the `[[table]]` entries that let
`benchmarks/check_figures.py` check every cell against the file.

    python benchmarks/reuse/validation_tables.py docs/bench/validate-chat docs/bench/validate-memgpt

Prints markdown, then the manifest entries (for docs/figures.toml) after a `----` line.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

COLUMNS = (  # header, results key, format
    ("TTFT/full", "ttft_ratio_vs_full", "{:.3f}"),
    ("TTFT/limit", "ttft_ratio_vs_limit", "{:.2f}"),
    ("TTFT/peer", "ttft_ratio_vs_peer", "{:.2f}"),
    ("compute", "recompute_fraction_mean", "{:.3f}"),
    ("KL tf", "tf_kl_mean", "{:.1e}"),
    ("greedy exact", "greedy_exact_match", "{:.2f}"),
    ("first token", "first_token_agreement", "{:.2f}"),
    ("overhead ms", "overhead_ms_median", "{:.0f}"),
    ("n", "turns", "{}"),
)


def cell(summary: dict[str, Any], key: str, fmt: str) -> str:
    value = summary.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def table(results: dict[str, Any], default: str) -> str:
    header = ["strategy", *(h for h, _, _ in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for name, s in results["strategies"].items():
        label = f"{name} (default)" if name == default else name
        lines.append("| " + " | ".join([label, *(cell(s, k, f) for _, k, f in COLUMNS)]) + " |")
    return "\n".join(lines)


def manifest_entry(doc: str, heading: str, path: Path) -> str:
    columns = ", ".join(['""'] + [f'"{k}"' for _, k, _ in COLUMNS])
    return (
        f'[[table]]\ndoc = "{doc}"\nafter = "{heading}"\n'
        f"row = \"get('{path}/results.json', 'strategies', cells[0].split(' ')[0])\"\n"
        f"columns = [{columns}]\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--doc", default="docs/benchmarks.md")
    p.add_argument("--heading", default="#### Validation: {family}",
                   help="each table's heading, {family} the run's family")  # fmt: skip
    args = p.parse_args()
    tables, entries = [], []
    for folder in args.folders:
        results = json.loads((folder / "results.json").read_text())
        family = folder.name.removeprefix("validate-")
        heading = args.heading.format(family=family)
        tables += [heading, "", table(results, results.get("default_strategy", "")), ""]
        entries.append(manifest_entry(args.doc, heading, folder))
    print("\n".join(tables))
    print("----")
    print("\n".join(entries))


if __name__ == "__main__":
    main()
