"""What every results file records of the run that wrote it, so a figure quoted from it can be
traced: the commit, the command line, the date, the machine, each strategy label's resolved spec
and the sessions measured. `benchmarks/check_figures.py` reads it (and, for files stored before
it was written, the index `docs/bench/runs.toml`).

    {"provenance": {"commit": "0d66f7d...", "dirty": false, "command": "agentcache bench ...",
                    "date": "2026-12-03T16:40:00+00:00",
                    "machine": {"cores": 2, "torch_threads": 1, "torch": "2.13.0+cpu", ...},
                    "specs": {"rpdc": "rpdc:cover=1.5:exact_prefix=true:extra=0.2:..."},
                    "split": "validate", "sessions": ["reflexion-08", ...]}}
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentcache.bench.peer import PEER
from agentcache.reuse.base import STRATEGIES
from agentcache.reuse.selective import SelectiveOptions, SelectiveRecompute
from agentcache.reuse.spec import StrategySpec


def resolved_spec(spec: StrategySpec) -> str:
    """`spec` with every option its strategy resolves to, where it differs from the plain
    options, in name order: `rpdc` -> `rpdc:cover=1.5:exact_prefix=true:extra=0.2:...`. Two
    labels measure the same strategy exactly when their resolved specs are equal."""
    if spec.name not in STRATEGIES.names():  # the peer: no options
        return spec.label
    strategy = spec.build()
    if not isinstance(strategy, SelectiveRecompute):
        return spec.label if spec.options else spec.name
    plain = SelectiveOptions()
    pairs = [
        f"{f.name}={_text(getattr(strategy.options, f.name))}"
        for f in sorted(fields(SelectiveOptions), key=lambda f: f.name)
        if getattr(strategy.options, f.name) != getattr(plain, f.name)
    ]
    return ":".join([spec.name, *pairs])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def specs_of(labels: Iterable[str]) -> list[StrategySpec]:
    """The specs behind the strategy labels of a run's records (the peer's label is its own)."""
    return [
        StrategySpec(x, x) if x == PEER else StrategySpec.parse(x) for x in dict.fromkeys(labels)
    ]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's name (Linux's `model name`, else what `platform` says, else "unknown"):
    two CPUs of one architecture can pick other matrix-product kernels, and so other timings
    and the batched step's call rule."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """The facts a timing depends on: cores, CPU, torch threads, torch build, platform."""
    import torch

    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "torch": torch.__version__,
    }


def git_commit(root: Path | None = None) -> tuple[str | None, bool | None]:
    """HEAD's commit of the checkout holding this package and whether its tree has changes;
    (None, None) outside a git checkout (an installed wheel)."""
    where = root or Path(__file__).resolve().parents[2]
    try:
        head = _git(where, "rev-parse", "HEAD")
        dirty = bool(_git(where, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head, dirty


def _git(where: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, check=True, timeout=10
    )
    return out.stdout.strip()


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages now, to the two decimals the kernel reports."""
    return [round(x, 2) for x in os.getloadavg()]


def provenance(
    specs: Iterable[StrategySpec] = (),
    split: str | None = None,
    sessions: Iterable[str] = (),
    argv: list[str] | None = None,
    script: str | None = None,
) -> dict[str, Any]:
    """The `provenance` record of a results file written now, by this process. `argv`: the
    arguments (`sys.argv[1:]` when None). The command recorded is `agentcache <argv>`, or, for a
    `script` (its path from the repository root, e.g. `benchmarks/server/load.py`),
    `python <script> <argv>`."""
    commit, dirty = git_commit()
    args = sys.argv[1:] if argv is None else argv
    return {
        "commit": commit,
        "dirty": dirty,
        "command": " ".join([f"python {script}" if script else "agentcache", *args]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "specs": {s.label: resolved_spec(s) for s in specs},
        "split": split,
        "sessions": list(sessions),
    }


def provenance_line(record: dict[str, Any]) -> str:
    """A report's line naming a `provenance` record: the command, its commit, date and machine."""
    m = record["machine"]
    cpu = f"{m['cpu']}, " if m.get("cpu") else ""  # records before the CPU was named lack it
    return (f"`{record['command']}` at commit {record['commit']} ({record['date']}; {cpu}"
            f"{m['cores']} cores, {m['torch_threads']} torch thread(s)).")  # fmt: skip
