"""Dense decode over paged KV, every family, against `transformers`' logits on the whole
sequence: the prompt prefilled by our forward, then one token at a time past the sliding
window, on fragmented pages (several slot runs) and through both decode paths."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.dense import dense_step, reference_step, window_spans
from agentcache.decode.setup import DecodeSetup
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.model.attention import attention
from agentcache.model.families.base import SPARSE_DECODE
from agentcache.model.loading import LoadedModel, from_hf
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.testing import TINY_FAMILY_CONFIGS, tiny_family_hf_model

PROMPT, TOTAL = 20, 64  # decode 44 tokens: well past the tiny configs' window of 24


@pytest.fixture(scope="module", params=list(TINY_FAMILY_CONFIGS))
def pair(request: pytest.FixtureRequest) -> tuple[Any, LoadedModel]:
    hf = tiny_family_hf_model(request.param, seed=5)
    return hf, from_hf(hf, ByteTokenizer(), f"tiny-{request.param}")


def _fragmented(pool: PagePool, lengths: list[int]) -> SequenceKV:
    seq, other = SequenceKV(pool), SequenceKV(pool)
    for n in lengths:
        seq.extend(n)
        other.extend(pool.config.page_size)
    return seq


@pytest.mark.parametrize("step", [dense_step, reference_step], ids=["in-place", "gathered"])
def test_dense_decode_over_paged_kv_matches_transformers(
    pair: tuple[Any, LoadedModel], step: Any
) -> None:
    hf, model = pair
    ids = torch.randint(0, 256, (TOTAL,), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    c = model.config
    pool = PagePool(PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, 64, page_size=4))
    seq = _fragmented(pool, [3, 9, 8])
    out = model.forward.forward(ids[:PROMPT])
    seq.write_all(seq.slots(), out.keys, out.values)
    with torch.inference_mode():
        got = [step(model.forward, seq, int(t), PROMPT + i) for i, t in enumerate(ids[PROMPT:])]
    assert len(seq.spans()) > 1
    diff = (torch.stack(got) - want[PROMPT:]).abs().max().item()
    assert diff <= 1e-4


def test_window_spans_hold_exactly_the_last_window_tokens() -> None:
    pool = PagePool(PoolConfig(1, 1, 2, 32, page_size=4))
    seq = _fragmented(pool, [3, 9, 8, 5])
    for w in (1, 4, 7, 24):
        spans = window_spans(seq, w)
        slots = sorted(s for a, b in spans for s in range(a, b))
        assert slots == sorted(seq.slots()[-w:].tolist())


def test_sparse_decode_attends_a_window_layer_exactly_at_any_budget(
    pair: tuple[Any, LoadedModel],
) -> None:
    """A sliding-window layer needs no page selection: with a budget of one page, each step of
    such a layer equals the reference attention over every key the decoder holds, through the
    layer's window; a model whose every layer slides then decodes transformers' logits."""
    hf, model = pair
    f, c = model.forward, model.config
    if not f.spec.windowed:
        pytest.skip("no sliding-window layer")
    ids = torch.randint(0, 256, (TOTAL + 64,), generator=torch.Generator().manual_seed(9))
    prompt = PROMPT + 64  # a prompt of several pages, most of them outside every window
    config = DecodeConfig("quest", budget_pages=1)
    plan = DecodeSetup.resolve(model, config).plan
    out = f.forward(ids[:prompt])
    dec = SparseDecoder(f, plan, config, out.keys, out.values, len(ids))
    attend, checked = dec._attend, []

    def spy(layer: int, qg: torch.Tensor) -> torch.Tensor:
        got = attend(layer, qg)
        if (w := f.spec.window(layer)) is not None:
            held = [dec.kv.full_kv(layer, h) for h in range(c.num_kv_heads)]
            keys = torch.stack([k for k, _ in held], 1)
            values = torch.stack([v for _, v in held], 1)
            want = attention(qg.reshape(1, c.num_heads, -1), keys, values, None, f.scale, w)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
            checked.append(layer)
        return got

    object.__setattr__(dec, "_attend", spy)
    got = torch.stack([dec.step(int(t), prompt + i) for i, t in enumerate(ids[prompt:])])
    assert checked and {la for la in range(c.num_layers) if f.spec.window(la)} == set(checked)
    if all(f.spec.window(la) is not None for la in range(c.num_layers)):
        with torch.no_grad():
            want = hf(ids[None]).logits[0, prompt:]
        assert (got - want).abs().max().item() <= 1e-4


def test_sparse_decode_with_every_page_matches_transformers(pair: tuple[Any, LoadedModel]) -> None:
    """Sparse decode (quest) with a budget over every page is dense decode, on every family
    that supports it (the reference: transformers' logits on the whole sequence)."""
    hf, model = pair
    if SPARSE_DECODE in model.forward.limits():  # the refusal: tests/families/test_refusals.py
        pytest.skip(f"{model.forward.family.name} declares sparse decode beyond it")
    ids = torch.randint(0, 256, (TOTAL,), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    config = DecodeConfig("quest", budget_pages=10_000)
    plan = DecodeSetup.resolve(model, config).plan
    out = model.forward.forward(ids[:PROMPT])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the budget is clamped to the pages there are
        dec = SparseDecoder(model.forward, plan, config, out.keys, out.values, TOTAL)
    got = torch.stack([dec.step(int(t), PROMPT + i) for i, t in enumerate(ids[PROMPT:])])
    assert (got - want[PROMPT:]).abs().max().item() <= 1e-4
