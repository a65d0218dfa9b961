"""Saved store traces: a `StoreTrace` with the recorded store's configuration and the run's
counters, as gzip-compressed JSON (`save`), read back (`load`) and replayed later by
`agentcache replay-trace`, under a profiler if asked: the store's own cost studied without
running the model again."""

from __future__ import annotations

import dataclasses
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcache.bench.tiers.trace import Op, StoreTrace
from agentcache.errors import AgentCacheError, TraceFileError
from agentcache.tiers.config import TierConfig
from agentcache.tiers.store import TieredSegmentStore

FORMAT = "agentcache-store-trace"
VERSION = 1


@dataclass(frozen=True)
class SavedTrace:
    """A trace with what a replay needs: the recorded store's configuration (its disk folder
    left out: each replay gets a fresh one), eviction policy, and counters after the run."""

    trace: StoreTrace
    config: TierConfig
    eviction: str
    expected: dict[str, dict[str, int]]

    def store(self, disk_dir: Path) -> TieredSegmentStore:
        """A fresh store configured like the recorded one, its disk tier in `disk_dir`."""
        return TieredSegmentStore(dataclasses.replace(self.config, disk_dir=disk_dir),
                                  self.eviction)  # fmt: skip


def save(saved: SavedTrace, path: Path) -> None:
    """Write `saved` as gzip-compressed JSON (written to a temporary file, then renamed)."""
    t = saved.trace
    config = {f.name: getattr(saved.config, f.name) for f in dataclasses.fields(TierConfig)}
    config["disk_dir"] = None
    body = {
        "format": FORMAT, "version": VERSION,
        "layout": list(t.layout) if t.layout else None,
        "dtype": str(t.dtype).removeprefix("torch."),
        "rounds": [list(r) for r in t.rounds],
        "config": config, "eviction": saved.eviction, "expected": saved.expected,
        "ops": [[o.kind, o.model_id, o.tokenizer_id, o.cid, o.result, o.tokens, o.context_id,
                 [list(p) for p in o.pages]] for o in t.ops],
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(body, f, separators=(",", ":"))
    tmp.replace(path)


def load(path: Path) -> SavedTrace:
    """Read a trace `save` wrote; TraceFileError names what is wrong with any other file."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            body = json.load(f)
    except FileNotFoundError:
        raise TraceFileError(f"no trace file {path}") from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as e:
        raise TraceFileError(
            f"{path} is not a saved store trace (not gzip-compressed JSON: {e}); "
            "save one with `agentcache bench-tiers --save-traces`"
        ) from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise TraceFileError(f"{path} is JSON but not a store trace (no format {FORMAT!r})")
    if body.get("version") != VERSION:
        raise TraceFileError(
            f"{path} is a store trace of format version {body.get('version')!r}; this "
            f"agentcache reads version {VERSION}: record it again"
        )
    try:
        trace = StoreTrace(
            [Op(k, m, tk, cid, bool(r), int(n), ctx, tuple((int(i), int(c), int(mask))
                                                           for i, c, mask in pages))
             for k, m, tk, cid, r, n, ctx, pages in body["ops"]],
            [(int(a), int(b)) for a, b in body["rounds"]],
            _layout(body["layout"]),
            getattr(torch, body["dtype"]),
        )  # fmt: skip
        if not isinstance(trace.dtype, torch.dtype):
            raise ValueError(f"dtype {body['dtype']!r} is not a torch dtype")
        if any(o.kind not in ("lookup", "put", "update") for o in trace.ops):
            raise ValueError("an op of unknown kind")
        config = TierConfig(**body["config"])
        eviction = str(body["eviction"])
        expected = {str(t): {str(k): _number(v) for k, v in c.items()}
                    for t, c in body["expected"].items()}  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError, AgentCacheError) as e:
        raise TraceFileError(f"store trace {path} is malformed: {e}") from None
    return SavedTrace(trace, config, eviction, expected)


def _layout(value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"layout {value!r} is not [layers, KV heads, head dim]")
    layers, heads, dim = (int(x) for x in value)
    return layers, heads, dim


def _number(value: Any) -> Any:
    """A counter: an int, or a float for the times (read_s, write_s) they hold too."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"counter {value!r} is not a number")
    return value
