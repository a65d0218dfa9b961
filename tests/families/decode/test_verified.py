"""Verified sparse decode (greedy self-speculative: sparse drafts, one dense pass) emits dense
decode's tokens on every family serving sparse decode; its dense pass attends a sliding-window
layer through the window (the spec's attention)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.heads.prompts import tokenized_prompt
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import GenerationParams
from tests.decode.conftest import TOP_K_POLICIES
from tests.decode.test_sparse import engine
from tests.decode.test_verify import prompt


@pytest.mark.parametrize("policy", TOP_K_POLICIES)
def test_verified_sparse_decode_equals_dense_decode_on_every_family(
    tiny: LoadedModel, profile_file: Path, policy: str
) -> None:
    ids = tokenized_prompt(tiny, prompt(tiny))
    params = GenerationParams(max_new_tokens=40)
    dense = engine(tiny).generate(ids, params, commit=False)
    decode = {"policy": policy, "budget_pages": 2, "profile": profile_file, "verify": 4}
    verified = engine(tiny, **decode).generate(ids, params, commit=False)
    assert verified.token_ids == dense.token_ids
    s = verified.stats.decode
    assert s is not None and s.verify_passes > 0 and not s.verify_skipped
