"""The `tiny` model of the shared suites, once per model family variant (tiny random configs
built with `transformers`' own config classes, no download): a suite imported into this
package runs over every variant. A strategy the variant's family refuses (its declared limits,
`LlamaForward.require_strategy`) is skipped with the family's own reason; the refusal itself
is tested in test_refusals.py."""

from __future__ import annotations

import pytest

from agentcache.errors import ConfigError
from agentcache.model.loading import LoadedModel
from tests.families.declared import VARIANTS, model


@pytest.fixture(scope="package", params=VARIANTS)
def tiny(request: pytest.FixtureRequest) -> LoadedModel:
    return model(request.param, seed=11)


@pytest.fixture(autouse=True)
def _declared_strategies(request: pytest.FixtureRequest) -> None:
    """Skip a (family, strategy) pair the family declares it cannot serve."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or "name" not in callspec.params or "tiny" not in request.fixturenames:
        return
    tiny: LoadedModel = request.getfixturevalue("tiny")
    try:
        tiny.forward.require_strategy(callspec.params["name"])
    except ConfigError as e:
        pytest.skip(f"declared: {e}")
