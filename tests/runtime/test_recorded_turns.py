"""The engine reproduces the turns recorded before its decode loop became the `Decoder` seam:
token ids, finish reasons, text and stats, under dense, sparse and verified decode."""

from __future__ import annotations

import json
import os

import pytest

from agentcache.model.loading import LoadedModel
from tests.runtime.recorded_turns import RECORD, run_turns


def test_tiny_model_turns_match_the_record(tiny: LoadedModel) -> None:
    expected = json.loads(RECORD.read_text())["tiny"]
    assert run_turns(tiny) == expected


@pytest.mark.slow
def test_default_model_turns_match_the_record() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from agentcache.model.loading import load_model

    expected = json.loads(RECORD.read_text())["default"]
    assert run_turns(load_model(None)) == expected
