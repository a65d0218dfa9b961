"""The connector's refusal of models it cannot re-rotate, without vLLM: decided from the
model folder's config (engines/vllm/families.py), naming the family and the feature."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.engines.vllm.families import require_folder_rerotation, require_rerotation
from agentcache.errors import ConfigError, ModelLoadError
from agentcache.model.families.base import VLLM_REROTATION
from agentcache.testing import tiny_family_hf_model


def test_partial_rotary_alone_is_refused() -> None:
    """Phi-3 without a sliding window: every layer rotates alike, but only half of each head."""
    hf = tiny_family_hf_model("phi3", sliding_window=None)
    with pytest.raises(ConfigError, match=r"phi3 family \(phi3\) .*vLLM connector.*partial rotary"):
        require_rerotation(hf.config)


@pytest.mark.parametrize(
    ("variant", "why"),
    [("smollm3", "NoPE"), ("gemma3", "per-layer RoPE bases"), ("mistral", "sliding-window")],
)
def test_nope_layers_local_bases_and_windows_are_refused(variant: str, why: str) -> None:
    hf = tiny_family_hf_model(variant)
    with pytest.raises(ConfigError, match=VLLM_REROTATION) as e:
        require_rerotation(hf.config)
    assert why in str(e.value)


def test_a_model_type_no_family_declares_is_refused(tmp_path: Path) -> None:
    from transformers import GPTNeoXConfig

    GPTNeoXConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4).save_pretrained(
        tmp_path
    )
    with pytest.raises(ConfigError, match=r"needs a model family .*'gpt_neox' is not supported"):
        require_folder_rerotation(tmp_path)


def test_a_folder_without_a_config_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        require_folder_rerotation(tmp_path)


def test_llama_with_every_layer_rotating_alike_is_allowed() -> None:
    require_rerotation(tiny_family_hf_model("llama3").config)
