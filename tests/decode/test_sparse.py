"""Sparse decode against its reference, dense decode."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.kernels import page_attention
from agentcache.decode.policies import DECODE_POLICIES
from agentcache.heads.prompts import tokenized_prompt
from agentcache.model.llama import attention
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import SegmentedPrompt
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from tests.decode.conftest import TOP_K_POLICIES

# the sparse kernel sums in a different order than SDPA: fp32 rounding only
LOGIT_ATOL = 1e-4


def engine(model: LoadedModel, **decode: object) -> Engine:
    config = DecodeConfig(**decode)  # type: ignore[arg-type]
    return Engine(model, EngineConfig(strategy="full", kv_pages=256, decode=config))


def dense_and(
    model: LoadedModel, prompt: SegmentedPrompt, **decode: object
) -> tuple[Generation, Generation]:
    """The 40-token greedy turn of `prompt` on a dense engine, then on one with `decode`."""
    params = GenerationParams(max_new_tokens=40)
    dense = engine(model).generate(prompt, params, commit=False)
    return dense, engine(model, **decode).generate(prompt, params, commit=False)


def test_page_attention_over_every_page_equals_dense_attention() -> None:
    torch.manual_seed(0)
    s, hkv, g, dh = 37, 2, 3, 16
    q = torch.randn(1, hkv * g, dh)
    keys, values = torch.randn(s, hkv, dh), torch.randn(s, hkv, dh)
    pad = 48 - s  # three pages, the last one partly filled
    k = torch.nn.functional.pad(keys.transpose(0, 1), (0, 0, 0, pad))
    v = torch.nn.functional.pad(values.transpose(0, 1), (0, 0, 0, pad))
    valid = (torch.arange(48) < s).expand(hkv, -1)
    got = page_attention(q[0].view(hkv, g, dh), k, v, valid, dh**-0.5)
    ref = attention(q, keys, values, torch.tensor([s - 1]), dh**-0.5)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("policy", TOP_K_POLICIES)
def test_full_budget_equals_dense_decode(
    tiny: LoadedModel, long_prompt: SegmentedPrompt, profile_file: Path, policy: str
) -> None:
    with pytest.warns(UserWarning, match="clamped"):
        dense, sparse = dense_and(
            tiny, long_prompt, policy=policy, budget_pages=10_000, profile=profile_file,
            short_dense=False,
        )  # fmt: skip
    assert sparse.token_ids == dense.token_ids
    assert sparse.stats.decode_policy == policy
    assert sparse.stats.decode is not None and sparse.stats.decode.budget_clamped
    assert dense.stats.decode is None and dense.stats.decode_policy == "dense"


@pytest.mark.parametrize("policy", TOP_K_POLICIES)
def test_a_turn_the_budget_covers_whole_decodes_densely_and_says_so(
    tiny: LoadedModel, long_prompt: SegmentedPrompt, profile_file: Path, policy: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no clamping warning: no sparse decoder is built
        dense, got = dense_and(
            tiny, long_prompt, policy=policy, budget_pages=10_000, profile=profile_file
        )
    assert got.token_ids == dense.token_ids
    s = got.stats
    assert s.decode is None and s.decode_policy == "dense" and s.decode_fallbacks == 1
    pages = -(-(s.prompt_tokens + 40) // 16)
    assert s.decode_fallback_reason == (
        f"short: {s.prompt_tokens} + 40 tokens fill {pages} pages, every one within the budget "
        "of 10000 (a sparse decoder would attend them all)"
    )
    assert s.decode_fallback_kind == "short"
    # a budget one page short of the rankable pages (all but the sink and 2 recent): sparse
    budget = pages - 1 - 2 - 1
    _, sparse = dense_and(tiny, long_prompt, policy=policy, budget_pages=budget,
                          profile=profile_file)  # fmt: skip
    assert sparse.stats.decode is not None and sparse.stats.decode_policy == policy
    assert sparse.stats.decode_fallbacks == 0 and sparse.stats.decode_fallback_reason is None
    assert sparse.stats.decode_fallback_kind is None


def test_full_budget_logits_match_dense_step_by_step(tiny: LoadedModel) -> None:
    e = engine(tiny)
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (150,)).tolist()
    seq, _ = e.prefill(tokenized_prompt(tiny, ids))
    keys, values = seq.gather_all(slice(0, seq.num_tokens))
    plan = DECODE_POLICIES.get("quest")().plan(4, 2, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dec = SparseDecoder(tiny.forward, plan, DecodeConfig("quest", 10_000), keys, values, 200)
    try:
        for i, token in enumerate(torch.randint(0, 256, (40,)).tolist()):
            ref = e.step(seq, token, 150 + i)
            got = dec.step(token, 150 + i)
            torch.testing.assert_close(got, ref, rtol=0, atol=LOGIT_ATOL)
    finally:
        seq.free()


@pytest.mark.parametrize("apart", [False, True])
def test_a_decoder_set_up_from_the_pools_pages_in_place_holds_what_copies_give(
    tiny: LoadedModel, profile_file: Path, apart: bool
) -> None:
    """`DecodeSetup.sparse_decoder` reads the prompt's K/V where it lies in the pool (one run of
    slots in token order; `apart`: pages between them taken by another sequence, so copies):
    its tiers and page bounds equal a decoder's built from `gather_all`'s copies."""
    from agentcache.decode.setup import DecodeSetup

    e = engine(tiny)
    torch.manual_seed(1)
    if apart:
        other = e.prefill(tokenized_prompt(tiny, torch.randint(0, 256, (20,)).tolist()))[0]
        seq, _ = e.prefill(tokenized_prompt(tiny, torch.randint(0, 256, (8,)).tolist()))
        other.extend(40)  # the next pages are the other sequence's
        seq.extend(100)  # ... so this one's continue past them
        for layer in range(tiny.config.num_layers):  # some K/V in the tokens added
            k = torch.randn(100, tiny.config.num_kv_heads, tiny.config.head_dim)
            seq.write(layer, seq.slots()[8:], k, k.flip(0))
    else:
        seq, _ = e.prefill(tokenized_prompt(tiny, torch.randint(0, 256, (108,)).tolist()))
    config = DecodeConfig("flexicache", budget_pages=2, profile=profile_file)
    setup = DecodeSetup.resolve(tiny, config)
    keys = seq.read_all(slice(0, seq.num_tokens))[0]
    in_place = keys.untyped_storage().data_ptr() == e.ctx.pool.keys.untyped_storage().data_ptr()
    assert in_place != apart
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = setup.sparse_decoder(tiny, seq, 20)
        copies = seq.gather_all(slice(0, seq.num_tokens))
        ref = SparseDecoder(tiny.forward, setup.plan, config, *copies, seq.num_tokens + 20)
    assert got is not None and bool(got.kv.offload.any()) and bool((~got.kv.offload).any())
    for a, b in ((got.kv.arena_k, ref.kv.arena_k), (got.kv.arena_v, ref.kv.arena_v),
                 (got.kv.host_k, ref.kv.host_k), (got.kv.host_v, ref.kv.host_v),
                 (got.meta.kmin, ref.meta.kmin), (got.meta.kmax, ref.meta.kmax)):  # fmt: skip
        assert torch.equal(a, b)
    seq.free()


def needle_decoder(
    tiny: LoadedModel, policy: str, profile: Path | None, top_p: float = 1.0
) -> SparseDecoder:
    """A decoder over 40 pages of weak random keys with one needle key at token 333 (page 20)
    aligned with the query used in the tests."""
    c = tiny.config
    torch.manual_seed(0)
    keys = 0.05 * torch.randn(c.num_layers, 640, c.num_kv_heads, c.head_dim)
    values = torch.randn(c.num_layers, 640, c.num_kv_heads, c.head_dim)
    keys[:, 333] = 3.0 * torch.ones(c.head_dim)
    values[:, 333] = 7.0
    config = DecodeConfig(policy, budget_pages=3, profile=profile, top_p=top_p)
    from agentcache.decode.setup import DecodeSetup

    plan = DecodeSetup.resolve(tiny, config).plan
    return SparseDecoder(tiny.forward, plan, config, keys, values, 700)


@pytest.mark.parametrize("policy", TOP_K_POLICIES)
def test_small_budget_selects_the_needle_page(
    tiny: LoadedModel, profile_file: Path, policy: str
) -> None:
    dec = needle_decoder(tiny, policy, profile_file)
    c = tiny.config
    g = c.num_heads // c.num_kv_heads
    qg = torch.ones(c.num_kv_heads, g, c.head_dim)
    for layer in range(c.num_layers):
        dec._rerank(layer, qg)
        dec.kv.sync(layer)
        pages = dec.pages(layer)
        if (w := tiny.forward.spec.window(layer)) is not None:  # exactly its window's pages
            first, last = (dec.kv.num_tokens - w) // 16, -(-dec.kv.num_tokens // 16)
            assert torch.equal(pages, torch.arange(first, last).expand(c.num_kv_heads, -1))
            continue
        assert bool((pages == 20).any(1).all()), f"layer {layer}: {pages}"
        assert pages.shape[1] == 1 + 3 + 2  # sink + budget + two newest pages
        for h in range(c.num_kv_heads):
            assert 20 in dec.kv.resident_pages(layer, h)
        out = dec._attend(layer, qg).view(c.num_heads, c.head_dim)
        assert bool((out > 6.0).all())  # the needle's value dominates every query head


def test_sparse_decode_keeps_reuse_working(
    tiny: LoadedModel, long_prompt: SegmentedPrompt, profile_file: Path
) -> None:
    config = DecodeConfig("flexicache", budget_pages=4, profile=profile_file)
    e = Engine(tiny, EngineConfig(strategy="prefix", kv_pages=256, decode=config))
    params = GenerationParams(max_new_tokens=20)
    first = e.generate(long_prompt, params)
    second = e.generate(long_prompt, params)
    assert second.stats.reused_tokens > 0 and second.token_ids == first.token_ids
    assert first.stats.decode is not None and first.stats.decode.steps == 19
    assert e.ctx.pool.num_used == 0  # the sequence's pages are released after decode
    one = e.generate(long_prompt, GenerationParams(max_new_tokens=1))
    assert one.stats.decode is None and len(one.token_ids) == 1  # no step, no decoder built


def test_sparse_decode_releases_the_prompt_pages_beyond_its_fast_tier(
    tiny: LoadedModel, long_prompt: SegmentedPrompt, profile_file: Path
) -> None:
    """Once the decoder holds the prompt's KV, the engine's page pool keeps only as many pages
    as its fast tier fills (what `kv_bytes` counts of a sparse turn), fewer than dense holds."""
    used: list[int] = []
    held: list[int] = []
    for config in (
        DecodeConfig(),
        DecodeConfig("flexicache", budget_pages=4, profile=profile_file),
    ):
        e = Engine(tiny, EngineConfig(strategy="full", kv_pages=256, decode=config))
        pool = e.ctx.pool
        gen = e.generate(long_prompt, GenerationParams(max_new_tokens=5),
                         on_token=lambda _, pool=pool: used.append(pool.num_used))  # fmt: skip
        if gen.stats.decode is not None:
            fast = gen.stats.decode.fast_tier_kv_bytes + gen.stats.decode.metadata_bytes
            held.append(-(-fast // pool.config.page_bytes))
        assert pool.num_used == 0  # the turn's pages are freed with it
    dense, sparse = used[:5], used[5:]
    assert len(held) == 1 and 0 < held[0] < min(dense)
    assert sparse == held * 5


def decode_in_rounds(tiny: LoadedModel) -> int:
    """Every policy of `test_batch_step_sparse.PROMPTS` decoding its prompt in verified rounds
    of 4 drafts (reranks, pages opened, streaming windows sliding, drafts cut) to its room;
    the drafts cut, over all of them."""
    from tests.runtime.test_batch_step_sparse import PROMPTS, STEPS, sparse

    cut = 0
    for name, n in PROMPTS.items():
        d = sparse(tiny, name)
        token, position = 5, n
        while d.kv.num_tokens + 5 <= n + STEPS:
            got = d.advance(token, position, 4)
            position, token = position + len(got), got[-1]
        cut += d.stats().drafted_tokens - d.stats().accepted_tokens
    return cut


def test_the_cached_pages_are_the_pages_computed_afresh(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every policy decoding in verified rounds (pages opened, reranks, streaming windows
    sliding, drafts cut): each layer's attended pages, their rows' token indices and
    presence, served from the decoder's cache or computed anew, equal `pages(layer)`
    computed afresh; the cache serves calls and is refreshed when they change."""
    layer_pages = SparseDecoder._layer_pages
    served = {True: 0, False: 0}

    def checked(self: SparseDecoder, layer: int) -> tuple[torch.Tensor, ...]:
        before = self._cached[layer]
        pages, token, present = layer_pages(self, layer)
        fresh = self.pages(layer)
        assert torch.equal(pages, fresh)
        rows = fresh[:, :, None] * self.page + torch.arange(self.page)
        assert torch.equal(token, rows.flatten(1))
        assert torch.equal(present, (fresh[:, :, None] >= 0).expand_as(rows).flatten(1))
        served[before is not None and before[1] is pages] += 1
        return pages, token, present

    monkeypatch.setattr(SparseDecoder, "_layer_pages", checked)
    assert decode_in_rounds(tiny) > 0  # drafts were cut: the KV shrank under the cache
    assert served[True] > 0 and served[False] > 0


def test_attention_read_in_place_is_the_gathered_pages_attention(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every policy decoding in verified rounds (reranks promoting and evicting pages, pages
    opened, streaming windows sliding, drafts cut): a layer whose heads are all offloaded
    attends its heads' fast-tier slots in place, and that equals attention over `pages(layer)`
    gathered (the reference, `in_place` off) to fp32 rounding at every layer of every step."""
    attend = SparseDecoder._attend
    checked = {True: 0, False: 0}

    def both(self: SparseDecoder, layer: int, qg: torch.Tensor) -> torch.Tensor:
        got = attend(self, layer, qg)
        self.in_place = False
        want = attend(self, layer, qg)
        self.in_place = True
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        checked[self._slots[layer] is not None] += 1
        return got

    monkeypatch.setattr(SparseDecoder, "_attend", both)
    assert decode_in_rounds(tiny) > 0 and checked[True] > 0 and checked[False] > 0


def test_short_rule_holds_exactly_where_every_page_would_be_attended(
    tiny: LoadedModel, profile_file: Path
) -> None:
    def reason(new: int = 16, **decode: object) -> str | None:
        d = engine(tiny, profile=profile_file, **decode).decode
        return d.short_reason(160 - new, new)  # 160 tokens: 10 pages, 7 rankable (2 recent)

    assert reason(policy="quest", budget_pages=7) is not None
    assert reason(policy="quest", budget_pages=6) is None  # a page can be left out
    assert reason(policy="quest", budget_pages=7, top_p=0.9) is None  # top-p may keep fewer
    assert reason(policy="quest", budget_pages=7, short_dense=False) is None
    assert reason(new=1, policy="quest", budget_pages=7) is None  # no sparse step runs
    assert reason(policy="dense") is None
    # a streaming head's window of w pages leaves pages out once the turn has more than 1 + w
    assert reason(policy="streaming", budget_pages=7, policy_options={"window": 9}) is not None
    assert reason(policy="streaming", budget_pages=7, policy_options={"window": 8}) is None
