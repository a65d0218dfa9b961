"""The queries a figure's `value` is written in, and the trace of what one evaluation read.

A figure is a query over stored results, not a number typed twice. Each helper below names
its statistic and records, in a `Trace`, what the sentence quoting the result must then be
able to say (`figure_rules.py` holds those rules):

    vs(R, label, base)            per warm turn, base's field / label's on the same turn of one
                                  run: paired *within* the run when its configurations alternate
                                  per turn, *across* runs when they ran one after another
    ratio_of_medians(xs, ys)      median(xs) / median(ys): a different statistic from the median
                                  of per-turn ratios, and the sentence must say so
    decode_speed(D, policy)       per prompt, dense's decode time / the policy's, each with its
                                  set-up (setup=False: steady state, which the sentence must say)
    identical(xs, ys), compared(xs, ys), empty(xs, ys)
                                  replies compared only when both are non-empty
    every(xs)                     a claim about every item: per-item values, never a summary

Every list a statistic summarizes (median, q, mean, every) is recorded with its n and spread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from agentcache.bench.stats import quantile


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, bytes) samples, in MiB per minute."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mb = sum(b for _, b in points) / n
    num = sum((t - mt) * (b - mb) for t, b in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return num / den * 60 / 2**20


LABELLED = ("strategies", "configs")  # keyed by label: `agentcache bench`'s, its vLLM backend's


@dataclass(frozen=True)
class Sample:
    """A list a statistic summarized: its size and interquartile range."""

    statistic: str
    n: int
    q25: float | None
    q75: float | None


@dataclass
class Trace:
    """What one evaluation of a figure read and how (mutable: filled while it runs)."""

    files: list[str] = field(default_factory=list)
    labels: list[tuple[str, str]] = field(default_factory=list)  # (file, strategy label)
    pairings: list[tuple[str, str]] = field(default_factory=list)  # (file, "within"|"across")
    statistics: list[str] = field(default_factory=list)  # named statistics used
    samples: list[Sample] = field(default_factory=list)

    def read(self, path: str) -> None:
        if path not in self.files:
            self.files.append(path)


def _spread(statistic: str, xs: Sequence[Any]) -> Sample:
    nums = [float(x) for x in xs if isinstance(x, int | float) and not isinstance(x, bool)]
    if len(nums) != len(xs) or not nums:
        return Sample(statistic, len(xs), None, None)
    return Sample(statistic, len(xs), quantile(nums, 0.25), quantile(nums, 0.75))


def reply_text(reply: dict[str, Any]) -> str:
    """A reply as compared: its text and its tool calls' names and arguments (not their ids)."""
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in reply["tool_calls"]]
    return json.dumps([reply.get("content") or "", calls])


def is_empty(reply: dict[str, Any]) -> bool:
    return not (reply.get("content") or "").strip() and not reply["tool_calls"]


class Results:
    """The helpers a `value` expression may call, reading JSON files under `root`; each call
    records into `trace` (set per evaluation by `evaluate`)."""

    def __init__(self, root: Path, within: dict[str, bool] | None = None) -> None:
        self.root = root
        self.within = within or {}  # results file -> its configurations alternate per turn
        self.trace = Trace()

    @cache  # noqa: B019 - one instance per check; files are read once
    def _load(self, path: str) -> Any:
        return json.loads((self.root / path).read_text())

    def load(self, path: str) -> Any:
        self.trace.read(path)
        return self._load(path)

    def get(self, path: str, *keys: str | int) -> Any:
        """The value at `keys` in the JSON file `path`."""
        node = self.load(path)
        for k in keys:
            node = node[k]
        if "identical_to_full" in keys:  # the server run's count, empty replies included
            self.trace.statistics.append("identical, empties counted")
        if any(isinstance(k, str) and "speed_ratio" in k for k in keys):
            self.trace.statistics.append("steady state")  # bench-decode's stored summaries
        if len(keys) >= 2 and keys[0] in (*LABELLED, "summary", "by_case", "by_workload"):
            label = keys[1] if keys[0] in LABELLED else keys[2] if len(keys) > 2 else None
            if isinstance(label, str):
                self.trace.labels.append((path, label))
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
        `paths`; the fields `ttft/full` and `ttft/limit` are TTFT ratios on the same turn of
        the same run (paired within it: the harness times `full` and the limit per turn)."""
        out = []
        for path in [paths] if isinstance(paths, str) else paths:
            self.trace.labels.append((path, label))
            if "/" in field:  # a ratio to `full` or the limit timed on the same turn
                self.trace.pairings.append((path, "within"))
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
        """Per warm turn (and `match`): `base`'s `field` / `label`'s on the same turn, of the
        same round where the run measured several (`agentcache bench --backend vllm --rounds`)."""
        rows = self.records(path, **match)
        key = "strategy" if "strategy" in rows[0] else "config"

        def turn(r: dict[str, Any]) -> tuple[Any, ...]:
            return r["session"], r["turn"], r.get("round", 0)

        theirs = {turn(r): r[field] for r in rows if r[key] == base}
        self.trace.labels += [(path, label), (path, base)]
        self.trace.pairings.append((path, "within" if self.within.get(path, True) else "across"))
        return [theirs[turn(r)] / r[field] for r in rows if r[key] == label]

    def ratio_of_medians(self, xs: Sequence[float], ys: Sequence[float]) -> float:
        """median(xs) / median(ys): not the median of per-turn ratios."""
        self.trace.statistics.append("ratio of medians")
        return self.median(xs) / self.median(ys)

    def decode_speed(self, path: str, policy: str, setup: bool = True) -> list[float]:
        """Per prompt of a `bench-decode` run: dense's decode time / `policy`'s, each the sum
        of its steps plus (unless `setup=False`) the decoder's set-up."""
        if not setup:
            self.trace.statistics.append("steady state")
        self.trace.labels.append((path, policy))
        out = []
        for prompt in self.get(path, "per_prompt"):
            dense, p = prompt["policies"]["dense"], prompt["policies"][policy]
            out.append(self._decode_s(dense, setup) / self._decode_s(p, setup))
        return out

    @staticmethod
    def _decode_s(run: dict[str, Any], setup: bool) -> float:
        return float(sum(run["step_s"]) + (run["setup_s"] if setup else 0.0))

    def replies(self, path: str, label: str) -> list[dict[str, Any]]:
        """Every reply of `label` in a server fidelity run, sessions in order."""
        self.trace.labels.append((path, label))
        return [r for session in self.get(path, "replies", label) for r in session]

    def identical(self, xs: Sequence[dict[str, Any]], ys: Sequence[dict[str, Any]]) -> int:
        """Pairs of replies both non-empty and equal (text and tool calls)."""
        self.trace.statistics.append("identical")
        return sum(1 for x, y in self._pairs(xs, ys) if reply_text(x) == reply_text(y))

    def compared(self, xs: Sequence[dict[str, Any]], ys: Sequence[dict[str, Any]]) -> int:
        """Pairs of replies both non-empty: those an `identical` count is out of."""
        self.trace.statistics.append("identical")
        return len(self._pairs(xs, ys))

    def empty(self, xs: Sequence[dict[str, Any]], ys: Sequence[dict[str, Any]]) -> int:
        """Pairs where either reply is empty (nothing to compare)."""
        self.trace.statistics.append("identical")
        return len(xs) - len(self._pairs(xs, ys))

    @staticmethod
    def _pairs(
        xs: Sequence[dict[str, Any]], ys: Sequence[dict[str, Any]]
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        if len(xs) != len(ys):
            raise ValueError(f"{len(xs)} replies against {len(ys)}")
        return [(x, y) for x, y in zip(xs, ys, strict=True) if not is_empty(x) and not is_empty(y)]

    def every(self, xs: Sequence[Any]) -> bool:
        """True when every item holds: `xs` must be per-item values (a list of at least two),
        never one summary number standing for them."""
        if not isinstance(xs, list | tuple) or len(xs) < 2:
            raise TypeError(f"every() needs per-item values, got {xs!r}")
        self.trace.statistics.append("every")
        self.trace.samples.append(Sample("every", len(xs), None, None))
        return all(bool(x) for x in xs)

    def median(self, xs: Sequence[float]) -> float:
        self.trace.samples.append(_spread("median", xs))
        return quantile(xs, 0.5)

    def q(self, xs: Sequence[float], p: float) -> float:
        self.trace.samples.append(_spread(f"q{round(100 * p)}", xs))
        return quantile(xs, p)

    def mean(self, xs: Sequence[float]) -> float:
        self.trace.samples.append(_spread("mean", xs))
        return sum(xs) / len(xs)

    def names(self, paths: dict[str, Any]) -> dict[str, Any]:
        helpers: tuple[str, ...] = ("get", "warm", "vs", "records", "ratio_of_medians")
        helpers += ("decode_speed",)
        helpers += ("replies", "identical", "compared", "empty", "every", "median", "q", "mean")
        return {
            **paths,
            **{h: getattr(self, h) for h in helpers},
            "count": lambda xs, v: sum(1 for x in xs if x == v),
            "min": min,
            "max": max,
            "len": len,
            "int": int,
            "sum": sum,
            "zip": zip,
            "slope": slope,
        }

    def evaluate(self, expression: str, names: dict[str, Any]) -> tuple[Any, Trace]:
        """`expression`'s value and the trace of what it read."""
        self.trace = Trace()
        # the manifest is a file of this repository; its expressions see only the helpers
        value = eval(expression, {"__builtins__": {}, **names})
        runs = {path for path, _ in self.trace.labels}
        if "ratio of medians" in self.trace.statistics and len(runs) > 1:
            self.trace.pairings += [(path, "across") for path in sorted(runs)]  # no turn pairs
        return value, self.trace
