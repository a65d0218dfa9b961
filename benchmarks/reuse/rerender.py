#!/usr/bin/env python3
"""Rewrite a bench run's report.md and plots from its results.json (after the report gained
sections), adding the summaries older runs did not store; the measurements are untouched.

    python benchmarks/reuse/rerender.py docs/bench/validate-chat
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agentcache.bench.reuse.report import cold, peer_ratios, plot, render_markdown, with_peer_ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    args = p.parse_args()
    for folder in args.folders:
        path = folder / "results.json"
        if not path.is_file():
            p.error(f"{path}: no results.json")
        results = json.loads(path.read_text())
        stored: dict[str, Any] = next(iter(results["strategies"].values()), {})
        if "cold" not in results or "ttft_ratio_vs_peer" not in stored:
            results["cold"] = cold(results["turns"])
            results["strategies"] = with_peer_ratios(
                results["strategies"], peer_ratios(results["turns"])
            )
            path.write_text(json.dumps(results, indent=1))
        (folder / "report.md").write_text(render_markdown(results))
        plot(results, folder)
        print(f"{folder}: report.md rewritten")


if __name__ == "__main__":
    main()
