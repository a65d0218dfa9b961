"""Greedy self-speculative decoding: sparse drafts verified by a dense pass reproduce dense
decoding, token for token, and leave dense K/V behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentcache.decode.config import DecodeConfig, parse_policy_spec
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.policies import DECODE_POLICIES
from agentcache.heads.prompts import tokenized_prompt
from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import SegmentedPrompt
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams


def engine(model: LoadedModel, **decode: object) -> Engine:
    config = DecodeConfig(**decode)  # type: ignore[arg-type]
    return Engine(model, EngineConfig(strategy="full", kv_pages=256, decode=config))


def prompt(tiny: LoadedModel, n: int = 300, seed: int = 0) -> list[int]:
    torch.manual_seed(seed)
    return torch.randint(0, 256, (n,)).tolist()


@pytest.mark.parametrize(
    "policy", ["quest", "quest:interval=4", "flexicache", "multiscale", "streaming"]
)
@pytest.mark.parametrize("draft", [1, 4, 7])
def test_verified_sparse_decode_equals_dense_decode(
    tiny: LoadedModel, profile_file: Path, policy: str, draft: int
) -> None:
    ids = tokenized_prompt(tiny, prompt(tiny))
    params = GenerationParams(max_new_tokens=60)
    dense = engine(tiny).generate(ids, params, commit=False)
    name, options = parse_policy_spec(policy)
    decode = {"policy": name, "budget_pages": 10, "profile": profile_file, **options}
    if policy == "streaming":  # windows slide across page boundaries and back after a cut
        decode["policy_options"] = {"window": 2}
    unverified = engine(tiny, **decode).generate(ids, params, commit=False)
    verified = engine(tiny, **decode, verify=draft).generate(ids, params, commit=False)
    # the budget is small enough that sparse decoding alone leaves dense's path
    assert unverified.token_ids != dense.token_ids
    assert verified.token_ids == dense.token_ids
    s = verified.stats.decode
    assert s is not None and s.verify_passes > 0 and not s.verify_skipped
    assert 0 < s.accepted_tokens < s.drafted_tokens  # some drafts kept, some rejected
    assert s.host_bytes_read > 0 or policy == "quest"  # quest offloads nothing (interval 1)


def assert_dense_path(
    e: Engine, seq: SequenceKV, first: int, out: list[int], dec: SparseDecoder
) -> None:
    """`out`, decoded after `first` by `dec` from a 200-token prompt, is what dense greedy
    decoding emits (stepped along the same tokens on `seq`), and `dec` holds dense's K/V of
    every token it holds."""
    token = first
    for i, t in enumerate(out):
        logits = e.step(seq, token, 200 + i)
        assert int(logits.argmax()) == t
        token = t
    ref_k, ref_v = seq.gather_all(slice(0, dec.kv.num_tokens))
    for layer in range(e.model.config.num_layers):
        for h in range(2):
            k, v = dec.kv.full_kv(layer, h)
            torch.testing.assert_close(k, ref_k[layer, :, h], rtol=0, atol=1e-5)
            torch.testing.assert_close(v, ref_v[layer, :, h], rtol=0, atol=1e-5)


def test_advance_leaves_dense_kv_for_the_kept_tokens(tiny: LoadedModel) -> None:
    """After rejected drafts are cut, the decoder's K/V of every token equals the K/V dense
    decoding computes for the same tokens."""
    e = engine(tiny)
    seq, pre = e.prefill(tokenized_prompt(tiny, prompt(tiny, 200, seed=1)))
    try:
        keys, values = seq.gather_all(slice(0, seq.num_tokens))
        plan = DECODE_POLICIES.get("quest")().plan(tiny.config.num_layers, 2, None)
        dec = SparseDecoder(tiny.forward, plan, DecodeConfig("quest", 2), keys, values, 260)
        token, position, out = int(pre.logits.argmax()), 200, []
        while len(out) < 40:
            got = dec.advance(token, position, 5)
            out += got
            position += len(got)
            token = got[-1]
        assert dec.stats().accepted_tokens < dec.stats().drafted_tokens
        assert_dense_path(e, seq, int(pre.logits.argmax()), out, dec)
    finally:
        seq.free()


@pytest.mark.parametrize("bonus", [True, False])
def test_a_round_dense_agrees_with_brings_dense_s_next_token(
    tiny: LoadedModel, bonus: bool
) -> None:
    """With a budget that holds every page, the drafts are dense's tokens: with the bonus
    every round's pass covers its last draft too and returns dense's token after it (draft + 1
    tokens), without it draft tokens; either way dense greedy decoding's tokens, and the KV
    holds every returned token but the last, with dense K/V."""
    e = engine(tiny)
    seq, pre = e.prefill(tokenized_prompt(tiny, prompt(tiny, 200, seed=1)))
    try:
        keys, values = seq.gather_all(slice(0, seq.num_tokens))
        plan = DECODE_POLICIES.get("quest")().plan(tiny.config.num_layers, 2, None)
        config = DecodeConfig("quest", 40, verify=3)
        with pytest.warns(UserWarning, match="every page is attended"):
            dec = SparseDecoder(tiny.forward, plan, config, keys, values, 260)
        token, position, out, lengths = int(pre.logits.argmax()), 200, [], []
        while len(out) < 24:
            got = dec.advance(token, position, 3, bonus=bonus)
            out += got
            lengths.append(len(got))
            position += len(got)
            token = got[-1]
        assert lengths == [4 if bonus else 3] * len(lengths)
        assert dec.stats().accepted_tokens == dec.stats().drafted_tokens == 3 * len(lengths)
        assert dec.kv.num_tokens == 200 + len(out)  # the prompt, the first token, out[:-1]
        assert_dense_path(e, seq, int(pre.logits.argmax()), out, dec)
    finally:
        seq.free()


def test_sampling_skips_verification_and_says_so(
    tiny: LoadedModel, long_prompt: SegmentedPrompt, profile_file: Path
) -> None:
    e = engine(tiny, policy="flexicache", budget_pages=2, profile=profile_file, verify=4)
    gen = e.generate(long_prompt, GenerationParams(max_new_tokens=10, temperature=0.8, seed=1))
    s = gen.stats.decode
    assert s is not None and s.verify_skipped and s.verify_passes == 0


class Forbid:
    """A token constraint (as structured outputs and logprobs are): `banned` never allowed."""

    def __init__(self, banned: set[int]) -> None:
        self.banned = banned

    def allowed(self, ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(logits.shape[0], dtype=torch.bool)
        mask[sorted(self.banned)] = False
        return mask


@pytest.mark.parametrize("batch", [False, True])
def test_a_constrained_turn_skips_verification_and_keeps_its_constraint(
    tiny: LoadedModel, long_prompt: SegmentedPrompt, profile_file: Path, batch: bool
) -> None:
    """Verified tokens are chosen by the decoder, not from logits a constraint could mask: a
    greedy turn with a token constraint decodes unverified (reported, as sampling is), and no
    token it emits is one the constraint forbids, alone and through the batched scheduler."""
    config = DecodeConfig("flexicache", budget_pages=2, profile=profile_file, verify=4)
    e = Engine(tiny, EngineConfig(strategy="full", kv_pages=256, decode=config,
                                  batch_decode=batch))  # fmt: skip
    free = e.generate(long_prompt, GenerationParams(max_new_tokens=12), commit=False)
    s = free.stats.decode
    assert s is not None and s.verify_passes > 0 and not s.verify_skipped
    banned = set(free.token_ids[1:6])
    params = GenerationParams(max_new_tokens=12, constraint=Forbid(banned))
    got = e.generate(long_prompt, params, commit=False)
    assert got.token_ids[0] == free.token_ids[0] and not banned & set(got.token_ids)
    s = got.stats.decode
    assert s is not None and s.verify_skipped and s.verify_passes == 0


def test_verified_decode_respects_max_tokens_and_stop(
    tiny: LoadedModel, long_prompt: SegmentedPrompt, profile_file: Path
) -> None:
    e = engine(tiny, policy="flexicache", budget_pages=2, profile=profile_file, verify=8)
    streamed: list[int] = []
    for n in (1, 2, 9, 13):
        gen = e.generate(long_prompt, GenerationParams(max_new_tokens=n), on_token=streamed.append)
        assert len(gen.token_ids) == n
        assert streamed[-n:] == list(gen.token_ids)


def test_negative_verify_is_rejected() -> None:
    with pytest.raises(ValueError, match="verify must be >= 0"):
        DecodeConfig("quest", verify=-1)
