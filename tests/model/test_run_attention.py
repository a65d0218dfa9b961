"""The run-split and blockwise attentions (fast paths) agree with the masked reference."""

from __future__ import annotations

import pytest
import torch

from agentcache.model.llama import attention
from agentcache.model.run_attention import (
    MAX_RUNS,
    PAD_PAIRS_PER_ROW,
    QueryRun,
    attention_pairs,
    blocked_attention,
    masked_attention,
    query_runs,
    runs_attention,
    runs_of,
)

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def qkv(t: int, s: int, seed: int = 0) -> QKV:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(t, 6, 16, generator=g),
        torch.randn(s, 2, 16, generator=g),
        torch.randn(s, 2, 16, generator=g),
    )


def test_query_runs_split_where_the_index_jumps() -> None:
    idx = torch.tensor([3, 4, 5, 9, 10, 20])
    assert query_runs(idx) == [(0, 3), (3, 5), (5, 6)]
    assert query_runs(torch.arange(7, 12)) == [(0, 5)]


@pytest.mark.parametrize(
    "index",
    [
        list(range(40, 100)),  # a suffix after a reused prefix
        list(range(0, 30)) + list(range(50, 100)),  # a reused segment in the middle
        list(range(10, 30)) + list(range(35, 60)) + [80, 81, 99],  # runs, the last token
        list(range(20, 70)),  # keys after the last query are ignored
    ],
)
def test_runs_attention_agrees_with_the_masked_reference(index: list[int]) -> None:
    query_index = torch.tensor(index)
    q, keys, values = qkv(len(index), 100)
    fast = runs_attention(q, keys, values, query_index, 0.25)
    assert fast is not None
    ref = masked_attention(q, keys, values, query_index, 0.25)
    torch.testing.assert_close(fast, ref, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(attention(q, keys, values, query_index, 0.25), fast)


@pytest.mark.parametrize("prefix", [0, 16, 60, 150, 400])
def test_padded_and_split_runs_agree_with_the_masked_reference(prefix: int) -> None:
    # a short run behind a long prefix splits, a long one behind a short prefix pads
    query_index = torch.cat([torch.arange(prefix, prefix + 40), torch.tensor([450, 451])])
    q, keys, values = qkv(len(query_index), 460)
    runs = runs_of(query_index)
    assert [r.padded for r in runs] == [prefix**2 / 2 <= PAD_PAIRS_PER_ROW * 40, False]
    fast = runs_attention(q, keys, values, query_index, 0.25)
    assert fast is not None
    ref = masked_attention(q, keys, values, query_index, 0.25)
    torch.testing.assert_close(fast, ref, atol=2e-6, rtol=1e-5)


def test_scattered_queries_run_blockwise_and_agree_with_the_reference() -> None:
    query_index = torch.cat([torch.arange(0, 4 * (MAX_RUNS + 1), 4), torch.arange(60, 75)])
    q, keys, values = qkv(len(query_index), 200)
    assert runs_attention(q, keys, values, query_index, 0.25) is None
    ref = masked_attention(q, keys, values, query_index, 0.25)
    torch.testing.assert_close(blocked_attention(q, keys, values, query_index, 0.25), ref)
    torch.testing.assert_close(attention(q, keys, values, query_index, 0.25), ref)


def test_attention_pairs_count_what_each_path_computes() -> None:
    assert attention_pairs(torch.arange(10), 10) == 55  # causal
    assert attention_pairs(torch.arange(6, 10), 10) == 55  # one run, padded: causal over 10
    split = QueryRun(0, 4, 100, 104)  # behind 100 keys: 5000 placeholder pairs > 64 * 4
    assert not split.padded and split.pairs == 4 * 100 + 1 + 2 + 3 + 4
    assert attention_pairs(torch.arange(100, 104), 110) == split.pairs
    scattered = torch.arange(0, 80, 5)  # 16 runs, 8 blocks of 2 rows
    ends = [int(scattered[r + 1]) + 1 for r in range(0, 16, 2)]
    assert attention_pairs(scattered, 100) == sum(2 * e for e in ends)
