"""Every registered strategy reproduces the turns recorded before the segment store became an
interface: generated ids, finish reasons, reused and recomputed token counts."""

from __future__ import annotations

import json
import os

import pytest

from agentcache.model.loading import LoadedModel
from tests.reuse.recorded_strategies import RECORD, run_turns


def test_tiny_model_turns_match_the_record(tiny: LoadedModel) -> None:
    expected = json.loads(RECORD.read_text())["tiny"]
    assert run_turns(tiny) == expected


@pytest.mark.slow
def test_default_model_turns_match_the_record() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from agentcache.model.loading import load_model

    expected = json.loads(RECORD.read_text())["default"]
    assert run_turns(load_model(None)) == expected
