"""The engine reproduces the turns recorded before its decode loop became the `Decoder` seam:
token ids, finish reasons, text and stats, under dense, sparse and verified decode."""

from __future__ import annotations

import pytest

from agentcache.model.loading import LoadedModel
from tests.records import default_model, recorded
from tests.runtime.recorded_turns import RECORD, run_turns


def test_tiny_model_turns_match_the_record(tiny: LoadedModel) -> None:
    assert run_turns(tiny) == recorded(RECORD, "tiny")


@pytest.mark.slow
def test_default_model_turns_match_the_record() -> None:
    assert run_turns(default_model()) == recorded(RECORD, "default")
