"""Records of turns the engine is held to: a JSON file with one entry per model, `tiny` (the
seeded test model) and `default` (the embedded default model, loaded offline)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentcache.model.loading import LoadedModel

RunTurns = Callable[[LoadedModel], Any]


def recorded(record: Path, model: str) -> Any:
    """The record's entry for `model` (`tiny` or `default`)."""
    return json.loads(record.read_text())[model]


def default_model() -> LoadedModel:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from agentcache.model.loading import load_model

    return load_model(None)


def write_record(record: Path, run_turns: RunTurns) -> None:
    """Run the turns on both models and write them to `record`."""
    from agentcache.testing import tiny_model

    print("agentcache from", sys.modules["agentcache"].__file__)
    turns = {"tiny": run_turns(tiny_model()), "default": run_turns(default_model())}
    record.write_text(json.dumps(turns, indent=1) + "\n")
