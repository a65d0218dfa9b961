from __future__ import annotations

import pytest
import torch

from agentcache.model import cope
from agentcache.model.cope import (
    CoPEAdapter,
    CoPEConfig,
    CoPEForward,
    NoRotation,
    cope_attention,
    cope_attention_reference,
)
from agentcache.testing import tiny_model


def _random_inputs(t: int, s: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    h, hkv, dh, p = 4, 2, 8, 5
    q = torch.randn(t, h, dh, generator=g, dtype=dtype)
    k = torch.randn(s, hkv, dh, generator=g, dtype=dtype)
    v = torch.randn(s, hkv, dh, generator=g, dtype=dtype)
    e = torch.randn(hkv, p + 1, dh, generator=g, dtype=dtype)
    return q, k, v, e


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_efficient_matches_reference_causal(dtype: torch.dtype, tol: float) -> None:
    q, k, v, e = _random_inputs(9, 9, dtype)
    fast = cope_attention(q, k, v, None, 0.35, e)
    ref = cope_attention_reference(q, k, v, torch.arange(9), 0.35, e)
    assert torch.allclose(fast, ref, atol=tol, rtol=0)


def test_efficient_matches_reference_subset_queries_and_cap() -> None:
    # queries at scattered indices of a longer context; positions exceed the cap P = 5
    q, k, v, e = _random_inputs(4, 14, torch.float64)
    idx = torch.tensor([2, 7, 8, 13])
    fast = cope_attention(q, k * 3, v, idx, 1.0, e)  # large logits: gates near 0 or 1
    ref = cope_attention_reference(q, k * 3, v, idx, 1.0, e)
    assert torch.allclose(fast, ref, atol=1e-10, rtol=0)


def test_query_blocks_agree_with_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v, e = _random_inputs(11, 11, torch.float64)
    whole = cope_attention(q, k, v, None, 0.5, e)
    monkeypatch.setattr(cope, "QUERY_BLOCK", 3)
    assert torch.allclose(cope_attention(q, k, v, None, 0.5, e), whole, atol=1e-12)


def test_positions_count_gates_in_reverse() -> None:
    m = tiny_model()
    f = CoPEForward(m.forward, CoPEAdapter.init(m.forward, CoPEConfig(max_position=3)))
    q, k, _ = f.project(0, f.embed(torch.tensor([5, 6, 7, 8, 9])), torch.arange(5))
    p = f.positions(0, q, k, torch.arange(5))  # (H, T, S)
    gates = torch.sigmoid(torch.einsum("hd,hd->h", q[4], k[4].repeat_interleave(2, 0)) * f.scale)
    assert torch.allclose(p[:, 4, 4], gates)  # p_ii = g_ii
    assert bool((p <= 3).all()) and bool((p[:, 0, 1:] == 0).all())  # capped; causal
    assert bool((p[:, 4, :-1] >= p[:, 4, 1:]).all())  # further back counts at least as much


def test_fresh_adapter_on_rope_equals_base_model() -> None:
    m = tiny_model()
    adapter = CoPEAdapter.init(m.forward, CoPEConfig(keep_rope=True))
    f = CoPEForward(m.forward, adapter)
    ids = torch.tensor([3, 40, 41, 42, 7, 99, 100])
    assert torch.allclose(f.forward(ids).logits, m.forward.forward(ids).logits, atol=1e-5)


def test_replacing_rope_makes_keys_position_free() -> None:
    m = tiny_model()
    f = CoPEForward(m.forward, CoPEAdapter.init(m.forward, CoPEConfig()))
    assert isinstance(f.rope, NoRotation)
    hidden = f.embed(torch.tensor([10, 11]))
    at0 = f.project(0, hidden, torch.tensor([0, 1])).k
    at500 = f.project(0, hidden, torch.tensor([500, 501])).k
    assert torch.equal(at0, at500)
    assert torch.equal(f.rope.rerotate(at0, torch.tensor([0, 1]), torch.tensor([9, 9])), at0)


def test_lora_changes_projection_only_when_b_nonzero() -> None:
    m = tiny_model()
    adapter = CoPEAdapter.init(m.forward, CoPEConfig(keep_rope=True, rank=2))
    f = CoPEForward(m.forward, adapter)
    hidden = f.embed(torch.tensor([1, 2, 3]))
    pos = torch.arange(3)
    before = f.project(1, hidden, pos).v
    adapter.layers[1].lora_b["v"].fill_(0.1)
    after = f.project(1, hidden, pos).v
    assert torch.equal(before, m.forward.project(1, hidden, pos).v)
    assert not torch.allclose(before, after)


def test_adapter_state_dict_round_trip_and_shape_errors() -> None:
    m = tiny_model()
    a = CoPEAdapter.init(m.forward, CoPEConfig(rank=2), seed=1)
    b = CoPEAdapter.init(m.forward, CoPEConfig(rank=2), seed=2)
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    other = CoPEAdapter.init(m.forward, CoPEConfig(rank=3))
    with pytest.raises(ValueError, match="shape"):
        other.load_state_dict(a.state_dict())


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="max_position"):
        CoPEConfig(max_position=0)
    with pytest.raises(ValueError, match="rank"):
        CoPEConfig(rank=0)
