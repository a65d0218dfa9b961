from __future__ import annotations

import pytest
import torch

from agentcache.errors import (
    AgentCacheError,
    ConfigError,
    ContextLengthError,
    OutOfPagesError,
    PromptError,
    UnknownStrategyError,
)
from agentcache.model.loading import LoadedModel
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.reuse.base import STRATEGIES, ReuseContext
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.testing import tiny_model

SYSTEM = "You are a careful agent. Answer briefly and cite the tool output you used. " * 2
USERS = ("list the files", "open README.md", "summarise it", "and the licence?")
# prefix vs full differ only by fp32 rounding (a different number of query rows per matmul)
LOGIT_ATOL = 1e-5


def make_engine(model: LoadedModel, strategy: str = "prefix") -> Engine:
    return Engine(model, EngineConfig(strategy=strategy, kv_pages=128))


def chat(history: list[tuple[str, str]], user: str) -> SegmentedPrompt:
    segs = [Segment(SegmentKind.SYSTEM, SYSTEM, "sys", "system")]
    for i, (u, a) in enumerate(history):
        segs.append(Segment(SegmentKind.FIXED, u, f"u{i}", "user"))
        segs.append(Segment(SegmentKind.FIXED, a, f"a{i}", "assistant"))
    segs.append(Segment(SegmentKind.UPDATE, user, "new", "user"))
    return SegmentedPrompt(segs)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def test_prefix_second_identical_turn_reuses_and_matches_full(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    prompt = chat([], USERS[0])
    params = GenerationParams(max_new_tokens=8)
    ref = engine.generate(prompt, params, strategy="full", commit=False)
    assert engine.store.stats.entries == 0  # commit=False stores nothing
    first = engine.generate(prompt, params, strategy="prefix")
    second = engine.generate(prompt, params, strategy="prefix")
    n = ref.stats.prompt_tokens
    assert first.stats.reused_tokens == 0
    assert second.stats.reused_tokens == (n // 16) * 16 > 0
    assert second.stats.recomputed_tokens == n - second.stats.reused_tokens
    assert max_diff(second.first_token_logits, ref.first_token_logits) <= LOGIT_ATOL
    assert torch.equal(first.first_token_logits, ref.first_token_logits)  # same computation
    assert second.token_ids == ref.token_ids == first.token_ids
    assert engine.store.stats.entries == n // 16


def test_prefix_matches_full_greedy_over_growing_conversation(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    params = GenerationParams(max_new_tokens=12)
    history: list[tuple[str, str]] = []
    reused = []
    for user in USERS:
        prompt = chat(history, user)
        ref = engine.generate(prompt, params, strategy="full", commit=False)
        out = engine.generate(prompt, params, strategy="prefix")
        assert out.token_ids == ref.token_ids
        assert out.finish_reason == ref.finish_reason
        assert max_diff(out.first_token_logits, ref.first_token_logits) <= LOGIT_ATOL
        reused.append(out.stats.reused_tokens)
        history.append((user, out.text))
    assert reused[0] == 0
    # every later turn reuses at least the system prompt + the previous history blocks
    assert all(r >= 16 * (len(SYSTEM) // 16) for r in reused[1:])
    assert reused == sorted(reused)


def test_pages_returned_after_generate(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    engine.generate(chat([], USERS[0]), GenerationParams(max_new_tokens=5))
    assert engine.ctx.pool.num_free == 128
    assert engine.ctx.pool.peak_pages_used > 0


def test_prompt_over_the_kv_pool_is_a_context_error_before_any_page(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(strategy="prefix", kv_pages=2))
    with pytest.raises(ContextLengthError, match=r"KV pool \(kv_pages=2 of 16 tokens\) holds 32"):
        engine.generate(chat([], USERS[0]))
    assert engine.ctx.pool.num_free == 2 and engine.ctx.pool.peak_pages_used == 0
    # the engine still works for a prompt that fits
    out = engine.generate(
        SegmentedPrompt([Segment(SegmentKind.UPDATE, "hi")]), GenerationParams(max_new_tokens=8)
    )
    assert out.stats.prompt_tokens == 2


def test_decode_stops_where_the_kv_pool_is_full(tiny: LoadedModel) -> None:
    """As at the model's last position: finish "length", every page given back."""
    engine = Engine(tiny, EngineConfig(strategy="full", kv_pages=2))
    prompt = engine.tokenize(SegmentedPrompt([Segment(SegmentKind.UPDATE, "x" * 20)]))
    free = Engine(tiny, EngineConfig(strategy="full")).generate(prompt, GenerationParams(48))
    out = engine.generate(prompt, GenerationParams(max_new_tokens=48, stop=()))
    # the pool holds the prompt and all but the last new token (whose K/V is never needed)
    room = 32 - prompt.num_tokens + 1
    assert len(free.token_ids) > room, "the reference must run past the pool to test this"
    assert out.token_ids == free.token_ids[:room] and out.finish_reason == "length"
    assert engine.ctx.pool.num_used == 0


def test_out_of_pages_mid_prefill_frees_the_partial_sequence(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(strategy="prefix", kv_pages=16))
    prompt = engine.tokenize(chat([], USERS[0]))
    assert 128 < prompt.num_tokens <= 256
    taken = engine.ctx.pool.allocate(8)  # another holder of pages (a tier's overlay, say)
    with pytest.raises(OutOfPagesError, match="kv_pages"):
        engine.generate(prompt)
    assert engine.ctx.pool.num_free == 8
    engine.ctx.pool.release(taken)


def test_stop_string_cuts_text_and_finishes_with_stop(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    prompt = chat([], USERS[1])
    free = engine.generate(prompt, GenerationParams(max_new_tokens=24), commit=False)
    ascii_at = [i for i, t in enumerate(free.token_ids) if 32 < t < 127 and i > 0]
    assert ascii_at, f"need a printable byte in {free.token_ids} to use as a stop string"
    k = ascii_at[0]
    stop = chr(free.token_ids[k])
    out = engine.generate(prompt, GenerationParams(max_new_tokens=24, stop=(stop,)), commit=False)
    assert out.finish_reason == "stop"
    assert out.token_ids == free.token_ids[: k + 1]  # stops right after the stop string
    assert stop not in out.text
    assert out.text == tiny.tokenizer.decode(free.token_ids[:k])
    # a stop string that never appears changes nothing
    never = engine.generate(
        prompt, GenerationParams(max_new_tokens=24, stop=("\x00zz",)), commit=False
    )
    assert never.token_ids == free.token_ids and never.text == free.text


def test_max_new_tokens_respected(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    prompt = chat([], USERS[2])
    for n in (1, 7):
        out = engine.generate(prompt, GenerationParams(max_new_tokens=n), commit=False)
        assert len(out.token_ids) == n
        assert out.finish_reason == "length"
        assert out.stats.decode_tokens == n
    none = engine.generate(prompt, GenerationParams(max_new_tokens=0), commit=False)
    assert none.token_ids == () and none.text == "" and none.finish_reason == "length"
    assert none.first_token_logits.shape == (tiny.config.vocab_size,)


def test_eos_finishes_with_stop(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    prompt = chat([], USERS[0])
    greedy = engine.generate(prompt, GenerationParams(max_new_tokens=1), commit=False)
    # make the greedy first token the end-of-text id by a tokenizer that treats it as EOS
    tok = ByteTokenizer()
    tok.eos_token_ids = frozenset({greedy.token_ids[0]})
    eos_model = LoadedModel(tiny.forward, tok, tiny.chat_format, tiny.model_id)
    out = make_engine(eos_model).generate(prompt, GenerationParams(max_new_tokens=8))
    assert out.token_ids == () and out.finish_reason == "stop"


def test_sampling_with_seed_is_reproducible(tiny: LoadedModel) -> None:
    engine = make_engine(tiny)
    prompt = chat([], USERS[3])

    def run(seed: int, top_p: float = 1.0) -> tuple[int, ...]:
        p = GenerationParams(max_new_tokens=16, temperature=1.0, top_p=top_p, seed=seed)
        return engine.generate(prompt, p, commit=False).token_ids

    a = run(123)
    assert a == run(123)
    assert a != run(124)
    assert run(7, top_p=0.5) == run(7, top_p=0.5)
    greedy = engine.generate(prompt, GenerationParams(max_new_tokens=16), commit=False).token_ids
    assert a != greedy


def test_generation_params_validation() -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationParams(max_new_tokens=-1)
    with pytest.raises(ValueError, match="top_p"):
        GenerationParams(top_p=0.0)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer >= 0, got 2.5"),
        ({"max_new_tokens": "3"}, "max_new_tokens must be an integer >= 0, got '3'"),
        ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ({"seed": 2**70}, "seed must be None or an integer"),
        ({"stop": ("",)}, "stop strings must be non-empty"),
        ({"stop": ("ok", 5)}, "stop strings must be non-empty"),
    ],
    ids=["fractional", "string", "negative-temp", "nan-temp", "seed-overflow", "empty-stop",
         "int-stop"],
)  # fmt: skip
def test_nonsense_generation_params_are_config_errors(
    options: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError) as e:
        GenerationParams(**options)  # type: ignore[arg-type]
    assert needle in str(e.value)
    assert isinstance(e.value, ValueError)  # still caught by `except ValueError`


def test_one_stop_string_is_one_stop_not_its_characters() -> None:
    assert GenerationParams(stop="ab").stop == ("ab",)  # type: ignore[arg-type]
    assert GenerationParams(stop=["ab", "c"]).stop == ("ab", "c")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "needle"),
    [
        ({"rpcd": {"ratio": 0.5}}, UnknownStrategyError, "unknown reuse strategy 'rpcd'"),
        ({"rpdc": {"ratio": 5}}, ConfigError, "strategy_options['rpdc']: ratio must be in [0, 1]"),
        ({"full": {"ratio": 0.5}}, ConfigError, "full takes no options"),
        ({"epic": 64}, ConfigError, "strategy_options['epic'] must be a dict"),
    ],
    ids=["unknown-strategy", "bad-value", "no-options", "not-a-dict"],
)
def test_bad_strategy_options_fail_when_the_config_is_made(
    options: dict[str, dict[str, object]], error: type[Exception], needle: str
) -> None:
    with pytest.raises(error) as e:
        EngineConfig(strategy_options=options)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"kv_pages": "8"}, "kv_pages must be a whole number, got '8'"),
        ({"kv_pages": 1.5}, "kv_pages must be a whole number, got 1.5"),
        ({"kv_pages": True}, "kv_pages must be a whole number, got True"),
        ({"kv_bytes": float("nan")}, "kv_bytes must be a whole number or None, got nan"),
        ({"page_size": 0}, "page_size must be >= 1 (tokens), got 0"),
        ({"store_bytes": -1}, "store_bytes must be >= 0, got -1"),
        ({"eviction": "lfu"}, "unknown eviction policy 'lfu'; known: fifo, lru"),
        ({"cost_guard": "no"}, "cost_guard must be True or False, got 'no'"),
        ({"batch_decode": 1}, "batch_decode must be True or False, got 1"),
        ({"strategy": ["rpdc"]}, "strategy must be a string, got ['rpdc']"),
        ({"strategy_options": None}, "strategy_options must be a dict of strategy name"),
        ({"preemption_host_bytes": None}, "preemption_host_bytes must be a whole number, got"),
        ({"decode": "flexicache"}, "decode must be a DecodeConfig, got 'flexicache'"),
    ],
    ids=["str-pages", "float-pages", "bool-pages", "nan-bytes", "zero-page-size",
         "negative-store", "unknown-eviction", "str-flag", "int-flag", "list-strategy",
         "none-options", "none-host-bytes", "str-decode"],
)  # fmt: skip
def test_engine_config_fields_of_the_wrong_type_or_range_are_named(
    options: dict[str, object], needle: str
) -> None:
    """From Python, a field of another type failed later as a comparison's TypeError, an
    mmap's, or not at all (a flag given as "no" read as true)."""
    with pytest.raises(AgentCacheError) as e:
        EngineConfig(**options)  # type: ignore[arg-type]
    assert needle in str(e.value)


def test_an_engine_needs_a_loaded_model_and_an_engine_config(tiny: LoadedModel) -> None:
    """What a newcomer passes first: a model's name, a dict of options."""
    with pytest.raises(ConfigError, match=r"Engine needs a loaded model \(agentcache.load_mod"):
        Engine("HuggingFaceTB/SmolLM2-135M-Instruct")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="config must be an EngineConfig, got dict"):
        Engine(tiny, {"strategy": "epic"})  # type: ignore[arg-type]


def test_a_turns_params_and_reply_are_checked(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(kv_pages=64))
    prompt = SegmentedPrompt([Segment(SegmentKind.UPDATE, "hello", role="user")])
    one = GenerationParams(max_new_tokens=1)
    with pytest.raises(ConfigError, match="params must be a GenerationParams, got dict"):
        engine.generate(prompt, {"max_new_tokens": 1})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="reply must be a function of the reply's text"):
        engine.generate(prompt, one, reply="assistant")  # type: ignore[arg-type]
    with pytest.raises(PromptError, match="reply\\(text\\) must return the reply's Segment or"):
        engine.generate(prompt, one, reply=lambda text: text)  # type: ignore[arg-type, return-value]
    # the first two before any work, the last once the turn ran: its pages are free again,
    # and the next turn's reply is the one a fresh engine gives
    assert engine.ctx.pool.num_used == 0
    fresh = Engine(tiny, EngineConfig(kv_pages=64)).generate(prompt, one)
    assert engine.generate(prompt, one).token_ids == fresh.token_ids


def test_unknown_strategy_lists_known(tiny: LoadedModel) -> None:
    known = STRATEGIES.names()
    assert {"full", "prefix"} <= set(known)
    with pytest.raises(UnknownStrategyError) as e:
        EngineConfig(strategy="magic")
    assert "'magic'" in str(e.value)
    assert str(e.value).endswith("known: " + ", ".join(sorted(known)))
    engine = make_engine(tiny)
    with pytest.raises(UnknownStrategyError) as e:
        engine.generate(chat([], "hi"), strategy="magic")
    assert all(name in str(e.value) for name in known)
    assert engine.ctx.pool.num_free == 128


@pytest.mark.parametrize("strategy", ["full", "prefix"])
def test_step_after_prefill_matches_dense_forward(tiny: LoadedModel, strategy: str) -> None:
    """Fast path (paged decode via step) vs the reference dense forward of the whole sequence."""
    engine = make_engine(tiny)
    prompt = chat([], USERS[1])
    engine.generate(prompt, GenerationParams(max_new_tokens=1), strategy="prefix")  # fills store
    tokens = engine.tokenize(prompt)
    extra = [72, 105, 33, 10, 200, 5]
    ref = tiny.forward.forward(torch.tensor(list(tokens.ids) + extra)).logits
    p = tokens.num_tokens
    seq, pre = engine.prefill(tokens, strategy)
    try:
        if strategy == "prefix":
            assert pre.stats.reused_tokens > 0
        assert seq.num_tokens == p
        assert pre.positions.tolist() == list(range(p))
        assert max_diff(pre.logits, ref[p - 1]) <= LOGIT_ATOL
        for i, tok in enumerate(extra):
            logits = engine.step(seq, tok, p + i)
            assert max_diff(logits, ref[p + i]) <= LOGIT_ATOL, f"step {i}"
        assert seq.num_tokens == p + len(extra)
    finally:
        seq.free()
    assert engine.ctx.pool.num_free == 128


def test_prompt_longer_than_context_names_both_lengths() -> None:
    small = tiny_model(max_positions=64)
    engine = make_engine(small)
    prompt = SegmentedPrompt([Segment(SegmentKind.UPDATE, "x" * 70)])
    with pytest.raises(ContextLengthError) as e:
        engine.generate(prompt)
    assert "70" in str(e.value) and "64" in str(e.value)
    assert engine.ctx.pool.num_free == 128


def test_prompt_filling_the_context_cannot_generate() -> None:
    engine = make_engine(tiny_model(max_positions=64))
    full = SegmentedPrompt([Segment(SegmentKind.UPDATE, "x" * 64)])
    with pytest.raises(ContextLengthError) as e:
        engine.generate(full)
    assert "65" in str(e.value) and "64" in str(e.value)
    # asking for no new tokens is fine
    assert engine.generate(full, GenerationParams(max_new_tokens=0)).token_ids == ()
    assert engine.ctx.pool.num_free == 128


def test_generation_stops_at_the_context_end() -> None:
    engine = make_engine(tiny_model(max_positions=64))
    prompt = SegmentedPrompt([Segment(SegmentKind.UPDATE, "y" * 60)])
    out = engine.generate(prompt, GenerationParams(max_new_tokens=10))
    assert len(out.token_ids) == 4  # positions 60..63
    assert out.finish_reason == "length"


def test_store_entry_of_another_model_is_not_reused(tiny: LoadedModel) -> None:
    """Acceptance: a cached segment from another model or tokenizer is never used."""
    prompt = chat([], USERS[0])
    params = GenerationParams(max_new_tokens=6)
    owner = make_engine(tiny)
    owner.generate(prompt, params, strategy="prefix")
    assert owner.store.stats.entries > 0

    other_tok = ByteTokenizer()
    other_tok.tokenizer_id = "bytes-v2"
    same_weights_other_tok = LoadedModel(tiny.forward, other_tok, tiny.chat_format, tiny.model_id)
    for model in (tiny_model(seed=1), same_weights_other_tok):
        assert (model.model_id, model.tokenizer.tokenizer_id) != (
            tiny.model_id,
            tiny.tokenizer.tokenizer_id,
        )
        engine = make_engine(model)
        engine.ctx = ReuseContext(model, owner.store, engine.ctx.pool)  # share owner's store
        ref = make_engine(model).generate(prompt, params, strategy="full")
        out = engine.generate(prompt, params, strategy="prefix", commit=False)
        assert out.stats.reused_tokens == 0
        assert torch.equal(out.first_token_logits, ref.first_token_logits)
        assert out.token_ids == ref.token_ids
    assert owner.store.stats.hits == 0
