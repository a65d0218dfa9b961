from __future__ import annotations

import pytest
import torch

from agentcache.model.loading import LoadedModel
from agentcache.testing import tiny_model


@pytest.fixture(autouse=True)
def _no_grad() -> object:
    with torch.no_grad():
        yield


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return tiny_model()
