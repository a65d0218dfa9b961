"""Streaming heads: the sink page and a window of the newest pages, never scored, against a
reference forward that attends exactly those tokens, and against dense decode."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import Tensor

from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.profile import HeadProfile, save_profile
from agentcache.decode.setup import DecodeSetup
from agentcache.heads.prompts import tokenized_prompt
from agentcache.model.llama import LlamaForward, attention
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import SegmentedPrompt
from agentcache.runtime.engine import GenerationParams
from tests.decode.conftest import make_profile
from tests.decode.test_sparse import LOGIT_ATOL, engine

PAGE = 16


def decoder(
    tiny: LoadedModel, profile: Path, window: int, tokens: int, steps: int, budget: int = 4
) -> tuple[SparseDecoder, Tensor, Tensor]:
    """A streaming decoder (every stable head streaming) over `tokens` random prompt tokens."""
    c = tiny.config
    torch.manual_seed(0)
    keys = torch.randn(c.num_layers, tokens, c.num_kv_heads, c.head_dim)
    values = torch.randn(c.num_layers, tokens, c.num_kv_heads, c.head_dim)
    options = {"fraction": 1.0, "window": window}
    config = DecodeConfig("streaming", budget, profile=profile, policy_options=options)
    plan = DecodeSetup.resolve(tiny, config).plan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a budget beyond the context is clamped
        dec = SparseDecoder(tiny.forward, plan, config, keys, values, tokens + steps)
    return dec, keys, values


def reference_step(
    f: LlamaForward, kv: list[tuple[Tensor, Tensor]], token: int, position: int, window: int
) -> Tensor:
    """One decode step attending, per layer, the tokens of page 0 and of the newest `window`
    pages of the full K/V `kv` (appended to)."""
    hidden = f.embed(torch.tensor([token]))
    for layer in range(f.config.num_layers):
        q, k, v = f.project(layer, hidden, torch.tensor([position]))
        keys, values = (torch.cat([x, y]) for x, y in zip(kv[layer], (k, v), strict=True))
        kv[layer] = (keys, values)
        pages = -(-len(keys) // PAGE)
        page = torch.arange(len(keys)) // PAGE
        keep = (page == 0) | (page >= max(1, pages - window))
        hidden = f.finish(layer, hidden, attention(q, keys[keep], values[keep], None, f.scale))
    return f.logits(hidden)[0]


@pytest.fixture
def all_stable(tiny: LoadedModel, tmp_path: Path) -> Path:
    """A profile with no unstable head: `fraction=1` makes every head a streaming head."""
    c = tiny.config
    stability = [[0.5] * c.num_kv_heads for _ in range(c.num_layers)]
    profile = HeadProfile(tiny.model_id, c.num_layers, c.num_kv_heads, stability, [])
    return save_profile(profile, tmp_path / "all-stable.json")


def test_streaming_heads_attend_the_sink_and_the_window_only(
    tiny: LoadedModel, all_stable: Path
) -> None:
    c, window, steps = tiny.config, 3, 40
    dec, keys, values = decoder(tiny, all_stable, window, 150, steps)
    kv = [(keys[layer], values[layer]) for layer in range(c.num_layers)]
    torch.manual_seed(1)
    for i, token in enumerate(torch.randint(0, 256, (steps,)).tolist()):
        ref = reference_step(tiny.forward, kv, token, 150 + i, window)
        got = dec.step(token, 150 + i)
        torch.testing.assert_close(got, ref, rtol=0, atol=LOGIT_ATOL)
        pages = -(-dec.kv.num_tokens // PAGE)
        expect = [0, *range(pages - window, pages)]
        for layer in range(c.num_layers):
            assert dec.pages(layer).tolist() == [expect] * c.num_kv_heads  # no budget columns
            for h in range(c.num_kv_heads):
                assert dec.kv.resident_pages(layer, h) == expect, f"step {i} ({layer}, {h})"
    s = dec.stats()
    assert s.head_reranks == 0 and s.pages_promoted == 0  # nothing scored, nothing promoted
    assert s.streaming_heads == c.num_layers * c.num_kv_heads and s.window_pages == window
    assert s.fast_tier_kv_bytes == c.num_layers * c.num_kv_heads * (1 + window) * dec.kv.page_bytes


def test_streaming_heads_never_rerank_and_hold_sink_and_window(
    tiny: LoadedModel, profile_file: Path
) -> None:
    """With the conftest profile (unstable heads (0, 1) and (2, 0)) and fraction 1, the six
    stable heads stream: only the two unstable heads rerank, every step."""
    window, steps = 2, 35
    dec, _, _ = decoder(tiny, profile_file, window, 300, steps)
    for i in range(steps):
        dec.step(i % 200, 300 + i)
    s = dec.stats()
    assert s.streaming_heads == 6 and s.head_reranks == steps * 2
    max_pages = -(-(300 + steps) // PAGE)
    slots = 2 * max_pages + 6 * (1 + window)
    assert s.fast_tier_kv_bytes == slots * dec.kv.page_bytes
    assert dec.kv.resident_pages(1, 1) == [0, 19, 20]


@pytest.mark.parametrize(("window", "same"), [(11, True), (10, False)])
def test_a_window_covering_the_context_equals_dense_decode(
    tiny: LoadedModel, all_stable: Path, window: int, same: bool
) -> None:
    """150 + 40 tokens fill 12 pages: the sink and a window of 11 attend every page, step by
    step within the dense step's logits; one page less does not."""
    e = engine(tiny)
    torch.manual_seed(0)
    seq, _ = e.prefill(tokenized_prompt(tiny, torch.randint(0, 256, (150,)).tolist()))
    keys, values = seq.gather_all(slice(0, seq.num_tokens))
    options = {"fraction": 1.0, "window": window}
    config = DecodeConfig("streaming", 4, profile=all_stable, policy_options=options)
    plan = DecodeSetup.resolve(tiny, config).plan
    dec = SparseDecoder(tiny.forward, plan, config, keys, values, 190)
    worst = 0.0
    try:
        for i, token in enumerate(torch.randint(0, 256, (40,)).tolist()):
            ref = e.step(seq, token, 150 + i)
            worst = max(worst, float((dec.step(token, 150 + i) - ref).abs().max()))
    finally:
        seq.free()
    assert (worst <= LOGIT_ATOL) == same, worst


def test_a_full_window_and_budget_give_dense_greedy_tokens(
    tiny: LoadedModel, profile_file: Path, long_prompt: SegmentedPrompt
) -> None:
    prompt = long_prompt
    params = GenerationParams(max_new_tokens=40)
    dense = engine(tiny).generate(prompt, params, commit=False)
    options = {"fraction": 1.0, "window": 10_000}
    with pytest.warns(UserWarning, match="clamped"):
        got = engine(
            tiny, policy="streaming", budget_pages=10_000, profile=profile_file,
            policy_options=options, short_dense=False,  # the sparse decoder, every page
        ).generate(prompt, params, commit=False)  # fmt: skip
    assert got.token_ids == dense.token_ids
    # every stable head streams, but on a sliding-window layer, which attends its window
    unstable = set(make_profile(tiny).unstable)
    spec, c = tiny.forward.spec, tiny.config
    heads = [(la, h) for la in range(c.num_layers) for h in range(c.num_kv_heads)]
    want = sum(spec.window(la) is None and (la, h) not in unstable for la, h in heads)
    assert got.stats.decode is not None and got.stats.decode.streaming_heads == want


def test_a_cut_back_across_a_page_boundary_brings_the_window_back(
    tiny: LoadedModel, all_stable: Path
) -> None:
    """After a verification cut (truncate) the window moves back: its page that had left is
    promoted from the host copy and the step equals the reference again."""
    c, window = tiny.config, 2
    dec, keys, values = decoder(tiny, all_stable, window, 150, 30)
    kv = [(keys[layer], values[layer]) for layer in range(c.num_layers)]
    for i in range(15):  # 165 tokens: pages 0 .. 10, window 9, 10
        reference_step(tiny.forward, kv, i, 150 + i, window)
        dec.step(i, 150 + i)
    assert dec.kv.resident_pages(0, 0) == [0, 9, 10]
    dec.kv.truncate(158)
    dec.meta.truncate(158)
    kv = [(k[:158], v[:158]) for k, v in kv]
    promoted = dec.stats().pages_promoted
    ref = reference_step(tiny.forward, kv, 7, 158, window)
    torch.testing.assert_close(dec.step(7, 158), ref, rtol=0, atol=LOGIT_ATOL)
    assert dec.kv.resident_pages(0, 0) == [0, 8, 9]  # page 8 is back, page 10 closed
    assert dec.stats().pages_promoted - promoted == c.num_layers * c.num_kv_heads


def test_the_options_come_from_the_spec_and_are_checked() -> None:
    config = DecodeConfig.from_spec("streaming:window=16:fraction=0.25:budget=32")
    assert config.policy_options == {"window": 16, "fraction": 0.25}
    assert config.budget_pages == 32
    with pytest.raises(ValueError, match=r"decode policy 'streaming': .*'sink'"):
        DecodeConfig("streaming", policy_options={"sink": 2})
    with pytest.raises(ValueError, match="window must be >= 1 page, got 0"):
        DecodeConfig("streaming", policy_options={"window": 0})
