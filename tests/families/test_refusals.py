"""Every (family variant, feature) pair a family declares beyond it (`ModelFamily.limits`) is
refused at configuration with an error naming the family and the feature, before any model
work: no embedding, projection or attention runs. The pairs come from the declarations, as the
suites' skips do (conftest.py, decode/conftest.py), so a feature is either served and tested
or refused and tested."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentcache.decode.config import DecodeConfig
from agentcache.engines.vllm.families import require_folder_rerotation, require_rerotation
from agentcache.errors import ConfigError
from agentcache.model.families.base import (
    FEATURES,
    SEGMENT_REUSE,
    SPARSE_DECODE,
    VLLM_REROTATION,
    Structure,
)
from agentcache.model.families.llama import LlamaFamily
from agentcache.model.llama import LlamaForward
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.testing import tiny_family_hf_model
from tests.decode.conftest import make_profile
from tests.families.declared import (
    KEY_MOVING_STRATEGIES,
    SPARSE_POLICIES,
    VARIANTS,
    limits,
    model,
    refusing,
    serving,
)


@contextmanager
def no_model_work(m: LoadedModel) -> Iterator[list[str]]:
    """Counts calls of the forward's compute methods on `m` while the block runs."""
    calls: list[str] = []
    f = m.forward
    saved = {name: getattr(f, name) for name in ("embed", "project", "attend", "forward")}

    def spy(name: str):  # type: ignore[no-untyped-def]
        def call(*args, **kw):  # type: ignore[no-untyped-def]
            calls.append(name)
            return saved[name](*args, **kw)

        return call

    for name in saved:
        setattr(f, name, spy(name))
    try:
        yield calls
    finally:
        for name in saved:
            delattr(f, name)  # the class's methods again


def test_every_declared_limit_is_a_known_feature_and_each_feature_splits_the_variants() -> None:
    for v in VARIANTS:
        assert set(limits(v)) <= set(FEATURES), v
    for feature in FEATURES:
        assert sorted(serving(feature) + refusing(feature)) == sorted(VARIANTS)
    assert refusing(VLLM_REROTATION) and serving(VLLM_REROTATION)  # both sides exercised


class Declaring(LlamaFamily):
    """A family declaring segment reuse and sparse decode beyond it (no registered family does
    today, so each refusal is exercised on this one too)."""

    def limits(self, s: Structure) -> dict[str, str]:
        return {**super().limits(s), SEGMENT_REUSE: "its keys cannot be moved",
                SPARSE_DECODE: "its pages cannot be ranked"}  # fmt: skip


def with_family(variant: str, monkeypatch: pytest.MonkeyPatch) -> LoadedModel:
    """The variant's model; "<variant>+declared": with the `Declaring` family."""
    m = model(variant.removesuffix("+declared"))
    if variant.endswith("+declared"):
        monkeypatch.setattr(m.forward, "family", Declaring())
    return m


SEGMENT_REFUSALS = [*refusing(SEGMENT_REUSE), "llama3+declared"]
SPARSE_REFUSALS = [*refusing(SPARSE_DECODE), "qwen3+declared"]


@pytest.mark.parametrize("strategy", KEY_MOVING_STRATEGIES)
@pytest.mark.parametrize("variant", SEGMENT_REFUSALS)
def test_a_key_moving_strategy_is_refused_where_the_family_declares_it(
    variant: str, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = with_family(variant, monkeypatch)
    family = m.forward.family.name
    with no_model_work(m) as calls:
        with pytest.raises(ConfigError, match=rf"{family} family .*strategy '{strategy}'"):
            Engine(m, EngineConfig(strategy=strategy))
        engine = Engine(m, EngineConfig(strategy="prefix"))  # a position-keeping one runs
        with pytest.raises(ConfigError, match=SEGMENT_REUSE.split(" (")[0]):
            engine.strategy(strategy)
    assert calls == []


@pytest.mark.parametrize("policy", SPARSE_POLICIES)
@pytest.mark.parametrize("variant", SPARSE_REFUSALS)
def test_sparse_decode_is_refused_where_the_family_declares_it(
    variant: str, policy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentcache.decode.profile import save_profile

    m = with_family(variant, monkeypatch)
    profile = save_profile(make_profile(m), tmp_path / "profile.json")
    config = EngineConfig(strategy="full", decode=DecodeConfig(policy, profile=profile))
    with no_model_work(m) as calls, pytest.raises(ConfigError) as e:
        Engine(m, config)
    assert calls == []
    assert f"{m.forward.family.name} family ({m.config.model_type})" in str(e.value)
    assert SPARSE_DECODE in str(e.value)
    assert m.forward.limits()[SPARSE_DECODE] in str(e.value)


@pytest.mark.parametrize("variant", refusing(VLLM_REROTATION))
def test_the_vllm_connectors_rerotation_is_refused_where_the_family_declares_it(
    variant: str, tmp_path: Path
) -> None:
    """From the model folder's config alone (no vLLM, no weights), as the connector and
    `VLLMBackend` do before vLLM loads the model."""
    hf = tiny_family_hf_model(variant)
    hf.config.save_pretrained(tmp_path)
    family = model(variant).forward.family.name
    for check in (
        lambda: require_rerotation(hf.config),
        lambda: require_folder_rerotation(tmp_path),
    ):
        with pytest.raises(ConfigError) as e:
            check()
        assert f"{family} family" in str(e.value) and VLLM_REROTATION in str(e.value)
        assert limits(variant)[VLLM_REROTATION] in str(e.value)


@pytest.mark.parametrize("variant", serving(VLLM_REROTATION))
def test_the_vllm_connectors_rerotation_is_allowed_where_the_family_serves_it(
    variant: str, tmp_path: Path
) -> None:
    hf = tiny_family_hf_model(variant)
    hf.config.save_pretrained(tmp_path)
    require_rerotation(hf.config)
    require_folder_rerotation(tmp_path)


def test_forward_methods_are_restored_after_the_spy() -> None:
    m = model("llama3")
    with no_model_work(m):
        pass
    assert m.forward.embed.__func__ is LlamaForward.embed  # type: ignore[attr-defined]
