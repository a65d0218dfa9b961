from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.bench.decode.needle import NEEDLE, QUESTION, needle_prompt, needle_prompts
from agentcache.errors import AgentCacheError
from agentcache.heads.prompts import load_texts, text_of_tokens, token_prompts
from agentcache.model.loading import LoadedModel
from tests.decode.conftest import TEXT

WORKLOAD = Path(__file__).parents[2] / "benchmarks" / "workloads" / "memgpt.jsonl"


def test_prompts_have_exactly_the_context_and_spread_offsets(tiny: LoadedModel) -> None:
    prompts = token_prompts(tiny, [TEXT], 300, 3)
    assert [p.num_tokens for p in prompts] == [300, 300, 300]
    assert len({p.ids for p in prompts}) == 3


def test_too_little_text_is_a_clear_error(tiny: LoadedModel) -> None:
    with pytest.raises(AgentCacheError, match="fewer than the context of 5000"):
        token_prompts(tiny, [TEXT], 5000, 1)


def test_text_and_workload_files(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text(TEXT)
    assert load_texts(path) == [TEXT]
    texts = load_texts(WORKLOAD)
    assert len(texts) > 1 and all(texts)
    with pytest.raises(AgentCacheError, match="does not exist"):
        load_texts(tmp_path / "missing.jsonl")


def test_needle_prompt_plants_the_needle_and_ends_with_the_question(tiny: LoadedModel) -> None:
    prompt = needle_prompt(tiny, [TEXT], 600)
    text = tiny.tokenizer.decode(list(prompt.ids))
    assert prompt.num_tokens == 600
    assert NEEDLE in text and text.endswith(QUESTION)
    assert 0.3 < text.index(NEEDLE) / len(text) < 0.7


def test_needle_prompts_spread_the_needle_over_depths_and_haystacks(tiny: LoadedModel) -> None:
    prompts = needle_prompts(tiny, [TEXT * 2], 600, 3)
    texts = [tiny.tokenizer.decode(list(p.ids)) for p in prompts]
    assert [p.num_tokens for p in prompts] == [600] * 3
    depths = [t.index(NEEDLE) / (len(t) - len(NEEDLE) - len(QUESTION)) for t in texts]
    assert depths == pytest.approx([0.1, 0.5, 0.9], abs=0.01)
    assert all(t.endswith(QUESTION) for t in texts) and texts[0][:50] != texts[2][:50]


def test_text_of_tokens_cuts_the_joined_texts_and_repeats_short_ones(tiny: LoadedModel) -> None:
    enc = tiny.tokenizer.encode("ab\n\ncd")
    assert text_of_tokens(tiny, ["ab", "cd"], 3) == tiny.tokenizer.decode(enc[:3])
    longer = len(enc) * 2 + 1  # more tokens than the texts hold: they repeat
    assert text_of_tokens(tiny, ["ab", "cd"], longer) == tiny.tokenizer.decode((enc * 3)[:longer])
