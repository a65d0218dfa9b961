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
from agentcache.errors import ConfigError
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
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


def test_sparse_decode_of_a_windowed_family_is_refused_at_configuration(
    pair: tuple[Any, LoadedModel],
) -> None:
    model = pair[1]
    config = DecodeConfig("quest")
    if model.forward.structure.attention.windowed:
        with pytest.raises(ConfigError, match="does not support sparse decode"):
            DecodeSetup.resolve(model, config)
    else:
        assert DecodeSetup.resolve(model, config).plan.sparse


def test_sparse_decode_with_every_page_matches_transformers(pair: tuple[Any, LoadedModel]) -> None:
    """Sparse decode (quest) with a budget over every page is dense decode, on every family
    that supports it (the reference: transformers' logits on the whole sequence)."""
    hf, model = pair
    if SPARSE_DECODE in model.forward.limits():
        pytest.skip(f"{model.forward.family.name} refuses sparse decode (tested above)")
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
