"""The files a benchmark run leaves in its output folder:

out/
  results.json   the measurements, with the run's `provenance` record
                 (`agentcache.bench.provenance`); `benchmarks/check_figures.py` checks the
                 figures the docs quote against it
  report.md      the report rendered from those results
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_run(
    out: Path, results: dict[str, Any], render: Callable[[dict[str, Any]], str] | None = None
) -> str | None:
    """Create `out` (and its parents) and write `out/results.json`: `results` as JSON, indented
    by one space, ending in a newline; then, given `render`, `out/report.md`: `render(results)`.
    Both UTF-8, replacing files already there. Returns the report's text (None without `render`).

    results.json is written before the report is rendered, so a run whose report fails keeps its
    measurements. Raises TypeError, writing nothing, for a value JSON cannot hold."""
    text = json.dumps(results, indent=1) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(text, encoding="utf-8")
    if render is None:
        return None
    report = render(results)
    (out / "report.md").write_text(report, encoding="utf-8")
    return report
