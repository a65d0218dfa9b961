"""Every family against `transformers` on tiny random configs built with its own config
classes: prefill logits, the layer API, a prompt past the sliding window, and re-rotation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentcache.errors import ConfigError, ModelLoadError
from agentcache.model.cope import NoRotation
from agentcache.model.families import FAMILIES, family_for, model_types
from agentcache.model.families.base import VLLM_REROTATION
from agentcache.model.loading import LoadedModel, from_hf
from agentcache.model.rope import RotaryEmbedding
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.testing import TINY_FAMILY_CONFIGS, tiny_family_hf_model

VARIANTS = list(TINY_FAMILY_CONFIGS)
LONG = 80  # tokens: past the tiny configs' sliding window of 24
TOL = 1e-4


@pytest.fixture(scope="module", params=VARIANTS)
def pair(request: pytest.FixtureRequest) -> tuple[Any, LoadedModel]:
    hf = tiny_family_hf_model(request.param, seed=1)
    return hf, from_hf(hf, ByteTokenizer(), f"tiny-{request.param}")


def _ids(n: int, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


def test_every_family_is_registered_and_found_by_model_type() -> None:
    assert set(FAMILIES.names()) >= {"llama", "qwen3", "smollm3", "gemma3", "phi3"}
    for variant, cfg in TINY_FAMILY_CONFIGS.items():
        assert cfg["model_type"] in model_types(), variant
    assert family_for("mistral").name == "llama"
    with pytest.raises(ModelLoadError, match="model_type 'gpt2' is not supported"):
        family_for("gpt2")


def test_prefill_logits_match_transformers_past_the_window(
    pair: tuple[Any, LoadedModel],
) -> None:
    hf, ours = pair
    ids = _ids(LONG)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    got = ours.forward.forward(ids).logits
    assert (got - want).abs().max().item() <= TOL


def test_layer_api_on_the_last_tokens_matches_the_full_forward(
    pair: tuple[Any, LoadedModel],
) -> None:
    """The last 6 tokens computed against supplied K/V (the path reuse and decode take)."""
    f = pair[1].forward
    ids = _ids(LONG, seed=3)
    ref = f.forward(ids)
    pos = torch.arange(LONG)
    cut = LONG - 6
    hidden = f.embed(ids[cut:])
    for layer in range(f.config.num_layers):
        q, k, v = f.project(layer, hidden, pos[cut:])
        keys = torch.cat([ref.keys[layer, :cut], k])
        values = torch.cat([ref.values[layer, :cut], v])
        hidden = f.attend(layer, hidden, q, keys, values, pos[cut:])
    assert (f.logits(hidden) - ref.logits[cut:]).abs().max().item() <= 1e-5


def test_a_segment_moved_by_rerotation_equals_it_computed_at_its_new_position(
    pair: tuple[Any, LoadedModel],
) -> None:
    """A segment alone (no context before it) at positions 0.. and at shift..: its hidden
    states depend on relative positions only, so every layer's keys at the new position are
    the old ones moved by the model's per-layer rotary (NoPE layers: unchanged)."""
    f = pair[1].forward
    ids, shift = _ids(40, seed=4), 300
    old = torch.arange(40)
    at_old = f.forward(ids, old).keys  # (L, T, Hkv, Dh)
    at_new = f.forward(ids, old + shift).keys
    moved = f.rotary.rerotate(at_old, old, old + shift)
    assert (moved - at_new).abs().max().item() <= TOL * at_new.abs().max().item()
    for layer in range(f.config.num_layers):
        one = f.rotary.rerotate_layer(layer, at_old[layer], old, old + shift)
        assert torch.equal(one, moved[layer])


def test_nope_layers_keep_their_keys_and_rotated_layers_move() -> None:
    f = from_hf(tiny_family_hf_model("smollm3"), ByteTokenizer(), "s").forward
    nope = [i for i, r in enumerate(f.rotary.layers) if r is None]
    assert nope == [3]  # transformers' default: every fourth layer
    keys = torch.randn(4, 10, 2, 16)
    moved = f.rotary.rerotate(keys, torch.arange(10), torch.arange(10) + 7)
    assert torch.equal(moved[3], keys[3])
    assert not torch.allclose(moved[0], keys[0])


def test_qwen2_windows_only_the_layers_past_max_window_layers() -> None:
    f = from_hf(tiny_family_hf_model("qwen2-window"), ByteTokenizer(), "q").forward
    assert [la.window for la in f.spec.layers] == [None, None, 24, 24]


def test_gemma3_layers_rotate_with_their_own_bases() -> None:
    f = from_hf(tiny_family_hf_model("gemma3"), ByteTokenizer(), "g").forward
    local, global_ = f.rotary.layers[0], f.rotary.layers[1]
    assert local is not None and global_ is not None and local is not global_
    assert f.rotary.layers[2] is local and f.rotary.layers[3] is global_
    assert f.scale == 24**-0.5
    assert [la.window for la in f.spec.layers] == [24, None, 24, None]


def test_partial_rotary_moves_only_the_rotated_share() -> None:
    params = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    rope = RotaryEmbedding.from_parameters(params, None, head_dim=16)
    k = torch.randn(5, 2, 16)
    pos = torch.arange(5)
    rotated = rope.apply(k, pos + 3)
    assert torch.equal(rotated[..., 8:], k[..., 8:])
    moved = rope.rerotate(rope.apply(k, pos), pos, pos + 3)
    assert torch.allclose(moved, rotated, atol=1e-5)


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("start", [0, 30])  # in the cos/sin table, and past its 32 positions
def test_rotating_q_and_k_together_equals_rotating_each(partial: float, start: int) -> None:
    params = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}
    rope = RotaryEmbedding.from_parameters(params, None, head_dim=16, max_positions=32)
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    pos = torch.arange(start, start + 5)
    q2, k2 = rope.apply_qk(q, k, pos)
    assert torch.equal(q2, rope.apply(q, pos)) and torch.equal(k2, rope.apply(k, pos))
    assert not torch.equal(k2, k)
    q3, k3 = NoRotation(rope).apply_qk(q, k, pos)  # CoPE's slot: nothing rotates
    assert q3 is q and k3 is k


@pytest.mark.parametrize(
    ("variant", "refused"),
    [
        ("llama3", set()),
        ("qwen2", set()),
        ("qwen2-window", {VLLM_REROTATION}),
        ("qwen3", set()),
        ("mistral", {VLLM_REROTATION}),
        ("smollm3", {VLLM_REROTATION}),
        ("gemma3", {VLLM_REROTATION}),
        ("phi3", {VLLM_REROTATION}),
    ],
)
def test_what_a_family_cannot_do_is_refused_naming_family_and_feature(
    variant: str, refused: set[str]
) -> None:
    hf = tiny_family_hf_model(variant)
    f = from_hf(hf, ByteTokenizer(), variant).forward
    assert set(f.limits()) == refused
    for feature in refused:
        with pytest.raises(ConfigError, match=f"{f.family.name} family .* does not support"):
            f.require(feature)
    if VLLM_REROTATION in refused:  # the connector's one-rotary re-rotation
        with pytest.raises(ConfigError, match="vLLM connector"):
            RotaryEmbedding.from_hf_config(hf.config, 16)


def test_gemma3_attention_softcapping_is_refused() -> None:
    from transformers import Gemma3TextConfig

    cfg = Gemma3TextConfig(num_hidden_layers=2, attn_logit_softcapping=50.0)
    with pytest.raises(ModelLoadError, match="gemma3 family: attn_logit_softcapping"):
        family_for("gemma3_text").structure(cfg)
