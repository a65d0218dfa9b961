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

and of `[[claim]]` entries, sentences with no number that the data must bear out:

    doc     = "docs/benchmarks.md"
    context = "same greedy tokens on every prompt"
    holds   = "every([p['engine']['greedy_agreement_with_engine'] == 1 for p in ...])"

`value`, `row`, column and `holds` expressions are queries over the stored results (paths
relative to the root), written with the helpers of `figure_query.py` (each names its statistic)
and the `[paths]` table of the manifest as names. A figure passes when its context is still in
its doc, the figure is inside the context, the value rounds to the figure, and the sentence it
stands in claims no more than the query read: its label, split, pairing and statistic
(`figure_rules.py`, against the run index `docs/bench/runs.toml`); a table passes when every
checked cell does; a claim when `holds` is true under the same rules. The archive itself is
checked too: every results file under docs/bench is in the run index, and every image there is
shown by a page. Exits 1 naming every problem; reads files only, runs no benchmark.

    python benchmarks/check_figures.py [--manifest docs/figures.toml] [--root .]
    python benchmarks/check_figures.py --list    # every figure: statistic, runs, labels, n, spread
    python benchmarks/check_figures.py --index   # writes docs/bench/README.md (figure_index.py)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings, when loaded by path

from figure_query import Results, Trace, quantile
from figure_rules import RUNS, Index, load_index, problems, sentence_of

FIELDS = ("doc", "context", "figure", "value")
TABLE_FIELDS = ("doc", "after", "row", "columns")
CLAIM_FIELDS = ("doc", "context", "holds")
NUMBER = re.compile(r"^[-+]?(\d+(?:\.(\d+))?)(?:e([-+]?\d+))?$")
KEY = re.compile(r"^\w+$")
LEADING = re.compile(r"^[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
PAGES = ("README.md", "docs/*.md", "docs/lab/*.md")
# the pages an image may be shown by: those, and the reports inside the archive itself
IMAGE_PAGES = (*PAGES, "docs/bench/**/*.md")
INDEX = "docs/bench/README.md"

__all__ = ["Results", "quantile"]


class ManifestError(ValueError):
    """The manifest itself is malformed (a missing or unknown key, an unparsable figure)."""


@dataclass(frozen=True)
class Checker:
    """What every check needs: the root, the query helpers, the run index, manifest names."""

    root: Path
    results: Results
    index: Index
    names: dict[str, Any]
    quoted_by: dict[str, set[str]] = field(default_factory=dict)  # results file -> pages

    def run(self, expression: str) -> tuple[Any, Trace]:
        return self.results.evaluate(expression, self.names)

    def rules(self, doc: str, unit: str, trace: Trace, claim: bool = False) -> list[str]:
        for f in trace.files:
            self.quoted_by.setdefault(f, set()).add(doc)
        return problems(unit, trace, self.index, doc, claim)

    def text(self, doc: str) -> str:
        return (self.root / doc).read_text()


@dataclass(frozen=True)
class Figure:
    """One quoted number: where it is written, and the query that yields it."""

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

    def check(self, c: Checker) -> list[str]:
        problem = located(self.doc, self.context, c.root, self.figure)
        if problem:
            return [problem]
        try:
            got, trace = c.run(self.value)
            got = float(got)
        except Exception as e:  # any error in an expression is a failed check, named
            return [f"cannot compute {self.value!r}: {type(e).__name__}: {e}"]
        tol = half_unit(self.figure) if self.tol is None else self.tol
        wrong = differs(self.figure, got, self.value, tol)
        unit = sentence_of(c.text(self.doc), self.context)
        return ([wrong] if wrong else []) + c.rules(self.doc, unit, trace)


@dataclass(frozen=True)
class Claim:
    """A sentence with no number whose query must hold (`every(...)`, a comparison)."""

    doc: str
    context: str
    holds: str

    @classmethod
    def parse(cls, raw: dict[str, Any], index: int) -> Claim:
        expect_keys(raw, CLAIM_FIELDS, (), f"claim #{index}")
        return cls(**raw)

    def check(self, c: Checker) -> list[str]:
        problem = located(self.doc, self.context, c.root)
        if problem:
            return [problem]
        try:
            held, trace = c.run(self.holds)
        except Exception as e:  # any error in an expression is a failed check, named
            return [f"cannot compute {self.holds!r}: {type(e).__name__}: {e}"]
        unit = sentence_of(c.text(self.doc), self.context)
        out = [] if held is True else [f"{self.holds!r} is {held!r}, not True"]
        return out + c.rules(self.doc, unit, trace, claim=True)


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
        """The cells of every data row of the first table at or after the `after` line (its
        header row first)."""
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
        return body[:1] + body[2:]  # the separator row left out

    def check(self, c: Checker) -> list[str]:
        where = f"table after {self.after!r}"
        try:
            rows = self.rows(c.root)
        except (OSError, LookupError) as e:
            return [f"{where}: {e}"]
        if len(rows) < 2:
            return [f"{where}: no table rows"]
        head = "| " + " | ".join(rows[0]) + " |"
        return [f"{where}: {e}" for cells in rows[1:] for e in self.check_row(cells, c, head)]

    def check_row(self, cells: list[str], c: Checker, head: str = "") -> list[str]:
        if len(cells) != len(self.columns):
            return [
                f"row {label(cells)!r} has {len(cells)} cells, the manifest {len(self.columns)}"
            ]
        try:
            r, row_trace = evaluate_row(self.row, cells, c)
        except Exception as e:  # any error in an expression is a failed check, named
            return [f"row {label(cells)!r}: cannot compute {self.row!r}: {type(e).__name__}: {e}"]
        errors = []
        unit = head + " " + "| " + " | ".join(cells) + " |"  # the header's words count too
        for cell, column in zip(cells, self.columns, strict=True):
            if column:
                value = column if not KEY.match(column) else f"r[{column!r}]"
                names = {**c.names, "r": r, "cells": cells}
                problem, trace = cell_mismatch(cell, value, names, c.results)
                if trace is not None:
                    trace.files[:0] = [f for f in row_trace.files if f not in trace.files]
                    trace.labels[:0] = row_trace.labels
                    problem = problem or "; ".join(c.rules(self.doc, unit, trace)) or None
                if problem:
                    errors.append(f"row {label(cells)!r}, column {column!r}: {problem}")
        return errors


def evaluate_row(row: str, cells: list[str], c: Checker) -> tuple[Any, Trace]:
    return c.results.evaluate(row, {**c.names, "cells": cells})


def label(cells: list[str]) -> str:
    """A row's name: its cells before the first that starts with a number (at least one)."""
    n = next((i for i, c in enumerate(cells) if LEADING.match(c.strip("*` "))), len(cells))
    return " | ".join(cells[: max(n, 1)])


def cell_mismatch(
    cell: str, value: str, names: dict[str, Any], results: Results
) -> tuple[str | None, Trace | None]:
    """(None, trace) when the cell's leading number is what `value` rounds to, or when `value`
    is None and the cell holds no number; else what is wrong."""
    m = LEADING.match(cell.strip("*` "))
    try:
        got, trace = results.evaluate(value, names)
    except Exception as e:  # any error in an expression is a failed check, named
        return f"cannot compute {value!r}: {type(e).__name__}: {e}", None
    if got is None and m is None:
        return None, trace
    if got is None or m is None:
        return f"cell {cell!r} against {got!r} from {value!r}", trace
    return differs(m.group(0), float(got), value, half_unit(m.group(0))), trace


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


def squash(text: str) -> str:
    return " ".join(text.split())


def located(doc: str, context: str, root: Path, figure: str | None = None) -> str | None:
    """None when the context (and the figure inside it) is still written in `doc`."""
    if not (root / doc).is_file():
        return f"{doc} does not exist"
    if figure is not None and figure not in context:
        return f"figure {figure!r} is not inside its context {context!r}"
    text = squash((root / doc).read_text())
    pattern = r"(?<![\d.])" + re.escape(squash(context)) + r"(?![\d])"
    if re.search(pattern, text) is None:
        return f"{doc} no longer contains {context!r}"
    return None


def differs(figure: str, got: float, value: str, tol: float) -> str | None:
    if abs(got - float(figure)) <= tol * (1 + 1e-9) + 1e-15:
        return None
    return f"value {got:.6g} from {value!r} does not round to {figure}"


@dataclass(frozen=True)
class Manifest:
    figures: list[Figure]
    tables: list[Table]
    claims: list[Claim]
    paths: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> Manifest:
        raw = tomllib.loads(path.read_text())
        return cls(
            [Figure.parse(f, i) for i, f in enumerate(raw.get("figure", []))],
            [Table.parse(t, i) for i, t in enumerate(raw.get("table", []))],
            [Claim.parse(c, i) for i, c in enumerate(raw.get("claim", []))],
            raw.get("paths", {}),
        )


def checker(manifest: Manifest, root: Path) -> Checker:
    index = load_index(root) if (root / RUNS).is_file() else Index("", {})
    within = {name: run.within_run for name, run in index.runs.items()}
    results = Results(root, within)
    return Checker(root, results, index, results.names(manifest.paths))


def check(manifest_path: Path, root: Path) -> list[str]:
    """Every problem found, one line each, naming the doc and the figure."""
    return checked(manifest_path, root)[0]


def checked(manifest_path: Path, root: Path) -> tuple[list[str], Checker]:
    """The problems found, and the checker (with what it read) that found them."""
    manifest = Manifest.read(manifest_path)
    c = checker(manifest, root)
    errors = []
    for fig in manifest.figures:
        errors += [f"{fig.doc}: {fig.figure} ({fig.context!r}): {e}" for e in fig.check(c)]
    for claim in manifest.claims:
        errors += [f"{claim.doc}: claim ({claim.context!r}): {e}" for e in claim.check(c)]
    for table in manifest.tables:
        errors += [f"{table.doc}: {e}" for e in table.check(c)]
    errors += undeclared(root, manifest)
    errors += archive(root, c.index)
    if c.index.runs and (root / INDEX).is_file():
        from figure_index import render_index

        if (root / INDEX).read_text() != render_index(c.index, c.quoted_by):
            errors.append(f"{INDEX} is out of date: python benchmarks/check_figures.py --index")
    return errors, c


RATIO = re.compile(r"(?<![\w.`=/-])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:x|%)(?![\w`])")
BOUND = re.compile(
    r"(<=|>=|<|>|~|\btop|at most|at least|about|up to|under|over|above|below|\bnot|reaches)\s*$"
)
UNSTORED = re.compile(r"not reproduced|no stored results", re.IGNORECASE)
CODE = re.compile(r"```.*?```|`[^`]*`", re.DOTALL)


def undeclared(root: Path, manifest: Manifest) -> list[str]:
    """Measured ratios and shares (`1.29x`, `97%`) on README.md and docs/*.md that no figure,
    claim or checked table declares: each must be, or sit in a sentence saying it has no
    stored results (its section says "not reproduced" or "no stored results"). A bound
    (`<= 0.8x`, `about 2x`) is a target or an estimate, not one."""
    covered: dict[str, list[str]] = {}
    entries: list[Figure | Claim] = [*manifest.figures, *manifest.claims]
    for entry in entries:
        covered.setdefault(entry.doc, []).append(squash(entry.context))
    for table in manifest.tables:
        try:
            rows = table.rows(root)
        except (OSError, LookupError):
            continue
        covered.setdefault(table.doc, []).extend("| " + " | ".join(r) for r in rows[1:])
    out = []
    for page in pages(root, ("README.md", "docs/*.md")):
        doc = page.relative_to(root).as_posix()
        text = squash(page.read_text())
        spans = [(i, i + len(c)) for c in covered.get(doc, []) for i in _finds(text, c)]
        spans += [m.span() for m in CODE.finditer(text)]
        for m in RATIO.finditer(text):
            if any(a <= m.start() < b for a, b in spans) or BOUND.search(text[: m.start()]):
                continue
            if text[m.end() :].startswith(" target"):
                continue
            if UNSTORED.search(section(text, m.start())):
                continue
            out.append(f"{doc}: {m.group(0)} ('...{text[max(0, m.start() - 40) : m.end()]}'): "
                       "a measured figure no entry declares")  # fmt: skip
    return out


def section(text: str, at: int) -> str:
    """The heading-to-heading section of squashed markdown `text` holding position `at`."""
    starts = [m.start() for m in re.finditer(r"(?:^| )#{1,4} ", text)]
    start = max((s for s in starts if s <= at), default=0)
    end = min((s for s in starts if s > at), default=len(text))
    return text[start:end]


def _finds(text: str, part: str) -> list[int]:
    out, at = [], text.find(part)
    while at >= 0:
        out.append(at)
        at = text.find(part, at + 1)
    return out


def archive(root: Path, index: Index) -> list[str]:
    """docs/bench as an archive: every results file in the run index, every image shown."""
    bench = root / "docs" / "bench"
    if not bench.is_dir() or not index.runs:
        return []
    out = []
    for path in sorted(bench.rglob("results.json")):
        name = path.relative_to(root).as_posix()
        if name not in index.runs:
            out.append(f"{name}: not in {RUNS}")
    for name, run in index.runs.items():
        if not (root / name).is_file():
            out.append(f"{RUNS}: {name} does not exist")
        if run.command is None:
            out.append(f"{RUNS}: {name}: no command recorded")
        if run.commit is None and run.stored is None:
            out.append(f"{RUNS}: {name}: neither the commit measured nor the one storing it")
    shown = shown_images(root)
    for image in sorted(bench.rglob("*.png")):
        if image.relative_to(root).as_posix() not in shown:
            out.append(f"{image.relative_to(root).as_posix()}: an image no page shows")
    return out


def pages(root: Path, patterns: tuple[str, ...] = PAGES) -> list[Path]:
    return [p for pattern in patterns for p in sorted(root.glob(pattern))]


def shown_images(root: Path) -> set[str]:
    """Images linked from README.md, docs/**/*.md, as paths from the root."""
    out = set()
    for page in pages(root, IMAGE_PAGES):
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            path = os.path.normpath(page.relative_to(root).parent / target)
            out.add(Path(path).as_posix())
    return out


def listing(manifest_path: Path, root: Path) -> list[str]:
    """One line per figure: doc, figure, statistic (the query), runs, labels, n and spread."""
    manifest = Manifest.read(manifest_path)
    c = checker(manifest, root)
    out = []
    for fig in manifest.figures:
        try:
            _, trace = c.run(fig.value)
        except Exception as e:  # listed, not raised: the check names it
            out.append(f"{fig.doc}\t{fig.figure}\t{fig.value}\terror: {e}")
            continue
        labels = sorted({f"{lb}={(c.index.runs[f].spec(lb) if f in c.index.runs else None) or '?'}"
                         for f, lb in trace.labels})  # fmt: skip
        samples = "; ".join(
            f"{s.statistic} n={s.n}"
            + (f" IQR {s.q25:.3g}-{s.q75:.3g}" if s.q25 is not None else "")
            for s in trace.samples
        )
        pairing = ",".join(sorted({p for _, p in trace.pairings})) or "-"
        out.append("\t".join([fig.doc, fig.figure, fig.value, ",".join(trace.files),
                              " ".join(labels), pairing, samples]))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", type=Path, default=Path("docs/figures.toml"))
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--list", action="store_true", help="print every figure's query and sample")
    p.add_argument("--index", action="store_true", help="write docs/bench/README.md")
    args = p.parse_args(argv)
    try:
        if args.list:
            print("\n".join(listing(args.manifest, args.root)))
            return 0
        if args.index:
            from figure_index import write_index

            print(f"wrote {write_index(args.manifest, args.root)}")
            return 0
        errors = check(args.manifest, args.root)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as e:
        print(f"check_figures: {e}", file=sys.stderr)
        return 2
    for line in errors:
        print(line)
    verdict = f"{len(errors)} mismatches" if errors else "every figure matches its file"
    print(f"check_figures: {verdict}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
