"""Checks every figure quoted in README.md and docs/ against the stored results it comes from.

Reads a manifest (default `docs/figures.toml`) of `[[figure]]` entries:

    doc     = "README.md"                      # the page the figure is quoted in
    context = "reaches its first token 1.89x"  # text of the line it is on (may span a line
                                               # break: whitespace is matched loosely)
    figure  = "1.89"                           # the number as written, inside `context`
    value   = "median(vs(VLLM, 'agentcache:pic@vllm', 'prefix'))"  # what yields it
    tol     = 0.01                             # optional; default: half a unit of the
                                               # figure's last written digit

and of `[[table]]` entries, which check every cell of a markdown table at once:

    doc     = "docs/lab/reuse.md"
    after   = "### reflexion, swing"           # the first table from the line holding this
    row     = "get(R, 'by_case', 'swing', cells[0])"   # a row's cells -> the row's results
    columns = ["", "ttft_ratio_vs_full", "100 * r['x']"]  # per cell: "" (not checked), a key
                                               # of the row's results, or an expression of `r`

A cell's figure is the number it starts with (`**2.26x**`, `0.986 (142 of 144)`); a column
expression that yields None asserts that the cell holds no number (`-`).

`value`, `row` and column expressions run over the stored results (paths relative to the
root), with the helpers below and the `[paths]` table of the manifest as names. A figure passes
when its context is still in its doc, the figure is inside the context, and the value rounds to
the figure; a table passes when every checked cell does. Exits 1 naming every figure and cell
that does not; reads files only, runs no benchmark.

    python benchmarks/check_figures.py [--manifest docs/figures.toml] [--root .]

(One file of a little over 300 lines: the scripts under benchmarks/ are run and loaded by path,
not imported as a package, so the checker does not split into modules.)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

FIELDS = ("doc", "context", "figure", "value")
TABLE_FIELDS = ("doc", "after", "row", "columns")
NUMBER = re.compile(r"^[-+]?(\d+(?:\.(\d+))?)(?:e([-+]?\d+))?$")
KEY = re.compile(r"^\w+$")
LEADING = re.compile(r"^[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


class ManifestError(ValueError):
    """The manifest itself is malformed (a missing or unknown key, an unparsable figure)."""


@dataclass(frozen=True)
class Figure:
    """One quoted number: where it is written, and how to recompute it."""

    doc: str
    context: str
    figure: str
    value: str
    tol: float | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any], index: int) -> Figure:
        expect_keys(raw, FIELDS, ("tol",), f"figure #{index}")
        if NUMBER.match(raw["figure"]) is None:
            raise ManifestError(f"figure #{index}: {raw['figure']!r} is not a number")
        return cls(**raw)


@dataclass(frozen=True)
class Table:
    """A markdown table whose cells are checked against one results row each."""

    doc: str
    after: str
    row: str
    columns: tuple[str, ...]

    @classmethod
    def parse(cls, raw: dict[str, Any], index: int) -> Table:
        expect_keys(raw, TABLE_FIELDS, (), f"table #{index}")
        return cls(raw["doc"], raw["after"], raw["row"], tuple(raw["columns"]))

    def rows(self, root: Path) -> list[list[str]]:
        """The cells of every data row of the first table at or after the `after` line."""
        lines = (root / self.doc).read_text().splitlines()
        start = next((i for i, line in enumerate(lines) if self.after in line), None)
        if start is None:
            raise LookupError(f"no line holds {self.after!r}")
        body = []
        for line in lines[start:]:
            if line.startswith("|"):
                body.append([c.strip() for c in line.strip().strip("|").split("|")])
            elif body:
                break
        return body[2:]  # header and separator rows left out

    def check(self, root: Path, names: dict[str, Any]) -> list[str]:
        where = f"{self.doc}: table after {self.after!r}"
        try:
            rows = self.rows(root)
        except (OSError, LookupError) as e:
            return [f"{where}: {e}"]
        if not rows:
            return [f"{where}: no table rows"]
        return [f"{where}: {e}" for cells in rows for e in self.check_row(cells, names)]

    def check_row(self, cells: list[str], names: dict[str, Any]) -> list[str]:
        if len(cells) != len(self.columns):
            return [
                f"row {label(cells)!r} has {len(cells)} cells, the manifest {len(self.columns)}"
            ]
        try:
            r = evaluate(self.row, {**names, "cells": cells})
        except Exception as e:  # any error in an expression is a failed check, named
            return [f"row {label(cells)!r}: cannot compute {self.row!r}: {type(e).__name__}: {e}"]
        errors = []
        for cell, column in zip(cells, self.columns, strict=True):
            if column:
                value = column if not KEY.match(column) else f"r[{column!r}]"
                problem = cell_mismatch(cell, value, {**names, "r": r, "cells": cells})
                if problem:
                    errors.append(f"row {label(cells)!r}, column {column!r}: {problem}")
        return errors


def label(cells: list[str]) -> str:
    """A row's name: its cells before the first that starts with a number (at least one)."""
    n = next((i for i, c in enumerate(cells) if LEADING.match(c.strip("*` "))), len(cells))
    return " | ".join(cells[: max(n, 1)])


def cell_mismatch(cell: str, value: str, names: dict[str, Any]) -> str | None:
    """None when the cell's leading number is what `value` rounds to, or when `value` is None
    and the cell holds no number; else what is wrong."""
    m = LEADING.match(cell.strip("*` "))
    try:
        got = evaluate(value, names)
    except Exception as e:  # any error in an expression is a failed check, named
        return f"cannot compute {value!r}: {type(e).__name__}: {e}"
    if got is None and m is None:
        return None
    if got is None or m is None:
        return f"cell {cell!r} against {got!r} from {value!r}"
    return differs(m.group(0), float(got), value, half_unit(m.group(0)))


def expect_keys(
    raw: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...], what: str
) -> None:
    missing = [k for k in required if k not in raw]
    unknown = sorted(set(raw) - {*required, *optional})
    if missing or unknown:
        raise ManifestError(f"{what}: missing {missing}, unknown {unknown}")


def half_unit(figure: str) -> float:
    """Half a unit of the last written digit: '2.26' -> 0.005, '1.2e-3' -> 5e-5."""
    m = NUMBER.match(figure)
    if m is None:
        raise ValueError(f"{figure!r} is not a number")
    decimals = len(m.group(2) or "")
    return 0.5 * 10.0 ** (int(m.group(3) or 0) - decimals)


def evaluate(expression: str, names: dict[str, Any]) -> Any:
    # the manifest is a file of this repository; its expressions see only the helpers
    return eval(expression, {"__builtins__": {}, **names})


def squash(text: str) -> str:
    return " ".join(text.split())


def quantile(xs: Iterable[float], p: float) -> float:
    """Linear interpolation between order statistics (numpy's default, 'inclusive')."""
    s = sorted(xs)
    if not s:
        raise ValueError("quantile of no values")
    k = (len(s) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, bytes) samples, in MiB per minute."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mb = sum(b for _, b in points) / n
    num = sum((t - mt) * (b - mb) for t, b in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return num / den * 60 / 2**20


class Results:
    """The helpers a `value` expression may call, reading JSON files under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @cache  # noqa: B019 - one instance per run; files are read once
    def load(self, path: str) -> Any:
        return json.loads((self.root / path).read_text())

    def get(self, path: str, *keys: str | int) -> Any:
        """The value at `keys` in the JSON file `path`."""
        node = self.load(path)
        for k in keys:
            node = node[k]
        return node

    def records(self, path: str, **match: Any) -> list[dict[str, Any]]:
        """Warm (turn > 0) per-turn records, `turns` of `agentcache bench` or `records` of its
        vLLM backend, whose fields equal `match` (e.g. workload="memgpt", case="swing")."""
        data = self.load(path)
        rows = data["turns"] if "turns" in data else data["records"]
        keep = [r for r in rows if r["turn"] > 0]
        return [r for r in keep if all(r[k] == v for k, v in match.items())]

    def warm(self, paths: str | list[str], label: str, field: str, **match: Any) -> list[float]:
        """`field` of every warm turn of strategy or config `label` (and `match`), pooled over
        `paths`; the fields `ttft/full` and `ttft/limit` are TTFT ratios on the same turn."""
        out = []
        for path in [paths] if isinstance(paths, str) else paths:
            for r in self.records(path, **match):
                if r.get("strategy", r.get("config")) == label:
                    out.append(self.field(r, field))
        return out

    @staticmethod
    def field(record: dict[str, Any], name: str) -> float:
        if name == "ttft/full":
            return float(record["ttft_ms"] / record["ttft_full_ms"])
        if name == "ttft/limit":
            return float(record["ttft_ms"] / record["ttft_limit_ms"])
        return float(record[name])

    def vs(
        self, path: str, label: str, base: str, field: str = "ttft_ms", **match: Any
    ) -> list[float]:
        """Per warm turn (and `match`): `base`'s `field` / `label`'s on the same turn."""
        rows = self.records(path, **match)
        key = "strategy" if "strategy" in rows[0] else "config"
        theirs = {(r["session"], r["turn"]): r[field] for r in rows if r[key] == base}
        return [theirs[(r["session"], r["turn"])] / r[field] for r in rows if r[key] == label]

    def names(self, paths: dict[str, Any]) -> dict[str, Any]:
        return {
            **paths,
            "get": self.get,
            "warm": self.warm,
            "vs": self.vs,
            "records": self.records,
            "q": quantile,
            "median": lambda xs: quantile(xs, 0.5),
            "mean": lambda xs: sum(xs) / len(xs),
            "count": lambda xs, v: sum(1 for x in xs if x == v),
            "min": min,
            "max": max,
            "len": len,
            "int": int,
            "sum": sum,
            "zip": zip,
            "slope": slope,
        }


def located(fig: Figure, root: Path) -> str | None:
    """None when the figure is still written where the manifest says; else what is wrong."""
    doc = root / fig.doc
    if not doc.is_file():
        return f"{fig.doc} does not exist"
    if fig.figure not in fig.context:
        return f"figure {fig.figure!r} is not inside its context {fig.context!r}"
    text = squash(doc.read_text())
    pattern = r"(?<![\d.])" + re.escape(squash(fig.context)) + r"(?![\d])"
    if re.search(pattern, text) is None:
        return f"{fig.doc} no longer contains {fig.context!r}"
    return None


def mismatch(
    figure: str, value: str, names: dict[str, Any], tol: float | None = None
) -> str | None:
    """None when `value` rounds to `figure`; else the computed value or the error."""
    try:
        got = float(evaluate(value, names))
    except Exception as e:  # any error in an expression is a failed check, named
        return f"cannot compute {value!r}: {type(e).__name__}: {e}"
    return differs(figure, got, value, half_unit(figure) if tol is None else tol)


def differs(figure: str, got: float, value: str, tol: float) -> str | None:
    if abs(got - float(figure)) <= tol * (1 + 1e-9) + 1e-15:
        return None
    return f"value {got:.6g} from {value!r} does not round to {figure}"


def check(manifest: Path, root: Path) -> list[str]:
    """Every problem found, one line each, naming the doc and the figure."""
    raw = tomllib.loads(manifest.read_text())
    figures = [Figure.parse(f, i) for i, f in enumerate(raw.get("figure", []))]
    tables = [Table.parse(t, i) for i, t in enumerate(raw.get("table", []))]
    names = Results(root).names(raw.get("paths", {}))
    errors = []
    for fig in figures:
        problem = located(fig, root) or mismatch(fig.figure, fig.value, names, fig.tol)
        if problem:
            errors.append(f"{fig.doc}: {fig.figure} ({fig.context!r}): {problem}")
    for table in tables:
        errors += table.check(root, names)
    return errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", type=Path, default=Path("docs/figures.toml"))
    p.add_argument("--root", type=Path, default=Path("."))
    args = p.parse_args(argv)
    try:
        errors = check(args.manifest, args.root)
    except (OSError, ManifestError, tomllib.TOMLDecodeError) as e:
        print(f"check_figures: {e}", file=sys.stderr)
        return 2
    for line in errors:
        print(line)
    verdict = f"{len(errors)} mismatches" if errors else "every figure matches its file"
    print(f"check_figures: {verdict}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
