"""A reply's KV, stored at generation under the form the reply takes in the next turn."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentcache.decode.config import DecodeConfig
from agentcache.decode.profile import HeadProfile, save_profile
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime import loop as loop_module
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams, ReplyKV
from agentcache.testing import scripted_sampler

REPLY = "Four."
SYSTEM = Segment(SegmentKind.SYSTEM, "You answer arithmetic questions tersely.", "sys", "system")


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy choice replaced by a script: the reply's bytes, then end of text."""
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(REPLY))


def turn1() -> SegmentedPrompt:
    return SegmentedPrompt([SYSTEM, Segment(SegmentKind.UPDATE, "What is 2 + 2?", "u1", "user")])


def turn2(reply: str = REPLY) -> SegmentedPrompt:
    return SegmentedPrompt([
        SYSTEM,
        Segment(SegmentKind.FIXED, "What is 2 + 2?", "u1", "user"),
        Segment(SegmentKind.FIXED, reply, "a1", "assistant"),
        Segment(SegmentKind.UPDATE, "And 3 + 3?", "u2", "user"),
    ])  # fmt: skip


def as_message(text: str) -> Segment:
    return Segment(SegmentKind.FIXED, text, "a1", "assistant")


PARAMS = GenerationParams(max_new_tokens=16)


@pytest.mark.parametrize("strategy", ["rpdc", "epic", "prefix", "promptcache"])
def test_the_stored_reply_is_reused_next_turn_exactly(
    tiny: LoadedModel, scripted: None, strategy: str
) -> None:
    e = Engine(tiny, EngineConfig(strategy=strategy, kv_pages=256))
    first = e.generate(turn1(), PARAMS, reply=as_message)
    assert first.text == REPLY and first.stats.reply_kv == "stored"
    second = e.generate(turn2(), PARAMS)
    assert not [m for m in second.stats.misses if m.segment_id == "a1"]
    prompt1 = e.tokenize(turn1()).num_tokens
    assert second.stats.reused_tokens > prompt1  # the reply's tokens came from the store
    ref = Engine(tiny, EngineConfig(strategy="full", kv_pages=256)).generate(turn2(), PARAMS)
    # the reply's KV was computed in the context and at the positions it has now: exact
    torch.testing.assert_close(second.first_token_logits, ref.first_token_logits, atol=1e-4, rtol=0)


def test_without_reply_the_message_is_a_miss(tiny: LoadedModel, scripted: None) -> None:
    e = Engine(tiny, EngineConfig(kv_pages=256))
    first = e.generate(turn1(), PARAMS)
    assert first.stats.reply_kv is None
    second = e.generate(turn2(), PARAMS)
    assert [m.reason for m in second.stats.misses if m.segment_id == "a1"] == ["new"]


def test_reasons_the_reply_is_not_stored(tiny: LoadedModel, scripted: None, tmp_path: Path) -> None:
    e = Engine(tiny, EngineConfig(kv_pages=256))
    assert e.generate(turn1(), PARAMS, reply=lambda t: None).stats.reply_kv == "no-reply"
    other = e.generate(turn1(), PARAMS, reply=lambda t: as_message("Five."))
    assert other.stats.reply_kv == "retokenized"
    prefilled = SegmentedPrompt(
        [*turn1().segments, Segment(SegmentKind.UPDATE, "", "p", "assistant")]
    )
    assert e.generate(prefilled, PARAMS, reply=as_message).stats.reply_kv == "no-generation-prompt"
    c = tiny.config
    profile = HeadProfile(tiny.model_id, c.num_layers, c.num_kv_heads,
                          [[0.5] * c.num_kv_heads] * c.num_layers, [(0, 0)])  # fmt: skip
    decode = DecodeConfig("flexicache", 2, profile=save_profile(profile, tmp_path / "p.json"))
    sparse = Engine(tiny, EngineConfig(kv_pages=256, decode=decode))
    assert sparse.generate(turn1(), PARAMS, reply=as_message).stats.reply_kv == "sparse-decode"
    assert all(reason.reason for reason in ReplyKV)  # each value says why
    # nothing stored for the reply in any of these: next turn it is computed
    assert [m.reason for m in e.generate(turn2(), PARAMS).stats.misses if m.segment_id == "a1"]


def test_the_outcome_is_an_enum_that_serializes_as_its_value(
    tiny: LoadedModel, scripted: None
) -> None:
    gen = Engine(tiny, EngineConfig(kv_pages=256)).generate(turn1(), PARAMS, reply=as_message)
    assert gen.stats.reply_kv is ReplyKV.STORED
    assert json.dumps({"reply_kv": gen.stats.reply_kv}) == '{"reply_kv": "stored"}'
    assert f"{gen.stats.reply_kv}" == "stored"
    # a value given as a string (the vLLM backend's) becomes the enum; unknown values fail
    assert replace(gen.stats, reply_kv="backend").reply_kv is ReplyKV.BACKEND
    with pytest.raises(ValueError, match="nope"):
        replace(gen.stats, reply_kv="nope")


def test_no_commit_means_no_reply_store(tiny: LoadedModel, scripted: None) -> None:
    e = Engine(tiny, EngineConfig(kv_pages=256))
    assert e.generate(turn1(), PARAMS, commit=False, reply=as_message).stats.reply_kv is None


def test_a_full_fast_tier_skips_the_reply_and_keeps_the_turn(
    tiny: LoadedModel, scripted: None
) -> None:
    """No page left for the closing tokens: the reply is not stored, the turn still succeeds."""
    for pad in range(16):
        prompt = SegmentedPrompt([
            SYSTEM, Segment(SegmentKind.UPDATE, "What is 2 + 2?" + " " * pad, "u1", "user"),
        ])  # fmt: skip
        fed = Engine(tiny, EngineConfig(kv_pages=64)).tokenize(prompt).num_tokens + len(REPLY)
        if fed % 16 == 15:
            break
    assert fed % 16 == 15  # the closing tokens need one more page
    e = Engine(tiny, EngineConfig(kv_pages=-(-fed // 16)))
    gen = e.generate(prompt, PARAMS, reply=as_message)
    assert gen.text == REPLY and gen.stats.reply_kv == "no-room"
    assert e.ctx.pool.num_used == 0
