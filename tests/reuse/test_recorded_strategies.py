"""Every registered strategy reproduces the turns recorded before the segment store became an
interface: generated ids, finish reasons, reused and recomputed token counts."""

from __future__ import annotations

import pytest

from agentcache.model.loading import LoadedModel
from tests.records import default_model, recorded
from tests.reuse.recorded_strategies import RECORD, run_turns


def test_tiny_model_turns_match_the_record(tiny: LoadedModel) -> None:
    assert run_turns(tiny) == recorded(RECORD, "tiny")


@pytest.mark.slow
def test_default_model_turns_match_the_record() -> None:
    assert run_turns(default_model()) == recorded(RECORD, "default")
