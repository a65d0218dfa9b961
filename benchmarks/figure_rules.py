"""What the sentence quoting a figure claims, held against what its query read.

The stored runs are listed in `docs/bench/runs.toml`, one `[runs."<results file>"]` each; what
a results file records of itself (its `provenance`, or the older top-level `command`, `split`,
`sessions`, `machine`) comes first, and the index adds only what the file does not record:

    default = "rpdc:cover=1.5:..."    # today's default strategy, resolved (tests tie it to code)
    previous = ["rpdc:..."]           # the defaults before it, resolved, newest first

    [runs."docs/bench/validate-memgpt/results.json"]  # (a file with a `provenance` record
                                      # needs no entry; one may still add `what`, `regenerate`)
    what = "reuse: memgpt validation sessions, every baseline and the default"
    stored = "185cd49 2026-12-03"     # the commit that stored the file (git), when the file
                                      # does not name the commit it was measured at
    within_run = true                 # configurations alternate per turn in one process
    specs = { rpdc = "rpdc:cover=1.5:..." }   # what each label resolved to, where known
    regenerate = "make bench-reuse"   # the target that reproduces it as stored, where one does

A figure's sentence (its table row, or the sentence of prose it stands in) may not claim more
than its trace shows:

| the sentence says            | the figure must have read                                    |
|------------------------------|--------------------------------------------------------------|
| "default"                    | a label whose resolved spec is today's default               |
| "previous default"           | a label whose resolved spec is one of `previous`             |
| "validation" / "tuning"      | runs of that split only                                      |
| (anything, README.md)        | validation runs, and only today's default or exact baselines |
| (a ratio paired across runs) | "separate runs" (or processes)                               |
| (a ratio of medians)         | "ratio of medians"                                           |
| (a steady-state decode speed)| "steady state" or "without set-up"                           |
| (a count over server replies)| counted with `identical`, empty replies left out             |
| "every" / "all" (a claim)    | `every()` over per-item values                               |
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from figure_query import Trace

RUNS = "docs/bench/runs.toml"
BASELINES = frozenset({"full", "prefix", "transformers-prefix"})  # exact: nothing to resolve
DEFAULT = re.compile(r"\bdefault\b", re.IGNORECASE)
PREVIOUS = re.compile(r"\b(previous|earlier) defaults?\b", re.IGNORECASE)
SPLITS = {"validate": re.compile(r"\bvalidation\b"), "tune": re.compile(r"\btuning\b")}
ACROSS = re.compile(r"separate (runs?|process(es)?)|across runs|one after (the )?other", re.I)
OF_MEDIANS = re.compile(r"ratio of (the |two )?medians", re.IGNORECASE)
STEADY = re.compile(r"steady[ -]state|without (the |its )?(decoder )?set-?up", re.IGNORECASE)
EVERY = re.compile(r"\b(every|all)\b", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.;])\s+(?=[A-Z`*(\[])")


@dataclass(frozen=True)
class Run:
    """One stored results file and what is known of the run that wrote it."""

    path: str
    what: str = ""
    command: str | None = None
    commit: str | None = None  # measured at; None: not recorded
    stored: str | None = None  # the commit that stored it, where `commit` is not recorded
    date: str | None = None
    split: str | None = None
    sessions: tuple[str, ...] = ()
    within_run: bool = True
    specs: dict[str, str] = field(default_factory=dict)
    regenerate: str | None = None
    quoted_by: tuple[str, ...] = ()

    def spec(self, label: str) -> str | None:
        """What `label` measured in this run: a baseline is itself, an option-free label is
        what the run recorded for it (None: not recorded)."""
        if label in self.specs:
            return self.specs[label]
        return label if label in BASELINES else None


@dataclass(frozen=True)
class Index:
    default: str  # today's default strategy, resolved
    runs: dict[str, Run]
    previous: tuple[str, ...] = ()  # the defaults before it, resolved


RUN_KEYS = {"what", "stored", "within_run", "specs", "regenerate", "split", "sessions",
            "command", "commit", "date"}  # fmt: skip


def load_index(root: Path, path: str = RUNS) -> Index:
    raw = tomllib.loads((root / path).read_text())
    runs = {}
    for name, entry in raw.get("runs", {}).items():
        if unknown := set(entry) - RUN_KEYS:
            raise ValueError(f"{path}: run {name!r}: unknown keys {sorted(unknown)}")
        runs[name] = merged(name, entry, recorded(root / name))
    for stored in sorted((root / "docs" / "bench").rglob("results.json")):
        name = stored.relative_to(root).as_posix()
        own = recorded(stored)
        if name not in runs and "provenance" in own:  # a file that describes itself
            runs[name] = merged(name, {}, own)
    return Index(raw["default"], runs, tuple(raw.get("previous", ())))


def recorded(path: Path) -> dict[str, Any]:
    """What a results file says of its own run (empty for one that is not a JSON object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    own = {k: data[k] for k in ("command", "split", "sessions") if k in data}
    made = data.get("provenance")
    return own | ({**made, "provenance": True} if isinstance(made, dict) else {})


def merged(name: str, entry: dict[str, Any], own: dict[str, Any]) -> Run:
    for key in ("command", "split", "commit"):
        if own.get(key) is not None and key in entry and entry[key] != own[key]:
            raise ValueError(f"run {name!r}: the index says {key} {entry[key]!r}, the file "
                             f"{own[key]!r}")  # fmt: skip
    specs = {**entry.get("specs", {}), **own.get("specs", {})}
    return Run(
        path=name,
        what=entry.get("what", ""),
        command=own.get("command", entry.get("command")),
        commit=own.get("commit", entry.get("commit")),
        stored=entry.get("stored"),
        date=own.get("date", entry.get("date")),
        split=own.get("split", entry.get("split")),
        sessions=tuple(own.get("sessions") or entry.get("sessions", ())),
        within_run=entry.get("within_run", True),
        specs=specs,
        regenerate=entry.get("regenerate"),
    )


def sentence_of(text: str, context: str) -> str:
    """The unit of `text` a quoted `context` stands in: its table row (after the table's
    header), or the sentence(s) of
    its paragraph that the context overlaps ("" when the context is not in the text)."""
    want = " ".join(context.split())
    for block in re.split(r"\n\s*\n|\n(?=\s*[-*] )", text):  # paragraphs and list items
        lines = block.splitlines()
        rows = [ln for ln in lines if ln.lstrip().startswith("|")]
        for row in rows:
            if want in " ".join(row.split()):  # the header's words count too
                return " ".join(rows[0].split()) + " " + " ".join(row.split())
        flat = " ".join(block.split())
        at = flat.find(want)
        if at < 0:
            continue
        out, start = [], 0
        for part in SENTENCE_END.split(flat):
            end = start + len(part)
            if start <= at + len(want) and at <= end:
                out.append(part)
            start = end + 1
        return " ".join(out)
    return ""


def problems(sentence: str, trace: Trace, index: Index, doc: str, claim: bool = False) -> list[str]:
    """Every way `sentence` claims more than `trace` read, one line each."""
    out = [f"reads {f}, which {RUNS} does not list" for f in trace.files if _unlisted(f, index)]
    runs = [index.runs[f] for f in trace.files if f in index.runs]
    specs = {(f, label): _spec(index, f, label) for f, label in trace.labels}
    said = []  # (the word, the specs it allows, what they are)
    if PREVIOUS.search(sentence):
        said.append(("previous default", set(index.previous),
                     f"the previous defaults are {', '.join(index.previous)}"))  # fmt: skip
    if DEFAULT.search(PREVIOUS.sub("", sentence)):
        said.append(("default", {index.default}, f"today's default is {index.default}"))
    allowed = set().union(*(specs for _, specs, _ in said))
    if specs and said and not allowed & set(specs.values()):  # naming both, it may read either
        out += [f"says '{word}', but measured {_named(specs)}; {what}" for word, _, what in said]
    named = [split for split, words in SPLITS.items() if words.search(sentence)]
    for split in named if len(named) == 1 else []:  # a sentence naming both contrasts them
        other = sorted({r.path for r in runs if r.split != split})
        if other:
            words = SPLITS[split]
            out.append(
                f"says '{words.pattern[2:-2]}', but reads {', '.join(other)} "
                f"(split: {', '.join(str(index.runs[o].split) for o in other)})"
            )
    if doc == "README.md":
        out += _readme(runs, specs, index.default)
    if any(p == "across" for _, p in trace.pairings) and not ACROSS.search(sentence):
        out.append("pairs configurations measured in separate runs; the sentence does not say so")
    if "ratio of medians" in trace.statistics and not OF_MEDIANS.search(sentence):
        out.append("is a ratio of medians; the sentence does not say so")
    if "steady state" in trace.statistics and not STEADY.search(sentence):
        out.append("is a decode speed without the decoder's set-up; the sentence does not say so")
    if "identical, empties counted" in trace.statistics:
        out.append("counts empty replies as identical: count with identical()/compared()")
    if claim and EVERY.search(sentence) and "every" not in trace.statistics:
        out.append("says every/all, but is not every() over per-item values")
    return out


def _unlisted(path: str, index: Index) -> bool:
    return path.startswith("docs/bench/") and path not in index.runs


def _spec(index: Index, path: str, label: str) -> str | None:
    run = index.runs.get(path)
    return run.spec(label) if run else None


def _named(specs: dict[tuple[str, str], str | None]) -> str:
    return ", ".join(sorted({f"{label} = {spec or 'unrecorded'}" for (_, label), spec in
                             specs.items()}))  # fmt: skip


def _readme(runs: list[Run], specs: dict[tuple[str, str], str | None], default: str) -> list[str]:
    out = [f"README quotes {r.path} (split: {r.split}); it quotes validation runs only"
           for r in runs if r.split != "validate"]  # fmt: skip
    other = {label: spec for (_, label), spec in specs.items()
             if spec != default and spec not in BASELINES}  # fmt: skip
    if other:
        out.append(f"README quotes {_named({('', k): v for k, v in other.items()})}: only "
                   "today's default and exact baselines")  # fmt: skip
    return out
