from __future__ import annotations

import pytest

from agentcache.model.loading import LoadedModel
from agentcache.reuse.planner.predictor import (
    FloorBound,
    KLFit,
    PlanFit,
    Predictor,
)


def predictor_for(model_id: str, kl_log10: float = -5.0) -> Predictor:
    """A predictor whose every approximate plan predicts 10**kl_log10 (less 1e-7)."""
    fit = KLFit((kl_log10, 0.0, 0.0, 0.0), 0.0)
    plans = {p: PlanFit(fit, fit, 10) for p in ("epic", "pic", "probe", "probe5")}
    floors = {"high": FloorBound(1e-4, 1e-4), "balanced": FloorBound(1e-2, 1e-2)}
    return Predictor(model_id, plans, floors, 0.9, {"split": "tune"})


@pytest.fixture
def tiny_predictor(tiny: LoadedModel) -> Predictor:
    return predictor_for(tiny.model_id)
