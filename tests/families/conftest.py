"""The `tiny` model of the shared suites, once per model family (tiny random configs built with
`transformers`' own config classes, no download): a suite imported into this package runs
over every family that supports what it tests."""

from __future__ import annotations

import pytest

from agentcache.model.loading import LoadedModel
from agentcache.testing import TINY_FAMILY_CONFIGS, tiny_family_model

# llama3 and qwen2 are the default tiny model's layer with another rope or biases (the
# forward and decode tests run them); every other variant changes what reuse touches
REUSE_VARIANTS = [v for v in TINY_FAMILY_CONFIGS if v not in ("llama3", "qwen2")]


@pytest.fixture(scope="package", params=REUSE_VARIANTS)
def tiny(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_family_model(request.param, seed=11)
