"""KV layouts of vLLM's paged tensors: per-token reads/writes and loud refusals (no vLLM)."""

from __future__ import annotations

import pytest
import torch

from agentcache.engines.vllm import UnsupportedKVLayoutError
from agentcache.engines.vllm.layout import CpuLayout, KVShape, SplitLastLayout, layout_for, slots_of

SHAPE = KVShape(num_kv_heads=3, head_size=8, block_size=32)


def _cpu_tensor(blocks: int = 4) -> torch.Tensor:
    return torch.zeros(blocks, SHAPE.num_kv_heads, SHAPE.block_size, 2 * SHAPE.head_size)


def test_cpu_layout_memory_order_matches_the_vec_kernel() -> None:
    """Keys [D, N] (transposed) then values [N, D] per block and head: the order vLLM's CPU
    "vec" kernel uses (measured against agentcache's forward on the default model)."""
    layer = _cpu_tensor()
    layout = CpuLayout(SHAPE)
    slots = slots_of([2, 0], 32, 30, 35)  # crosses from block 2 into block 0
    k, v = torch.randn(5, 3, 8), torch.randn(5, 3, 8)
    layout.write(layer, slots, k, v)
    b, h, d = 2, 1, 8
    keys = layer.view(4, 3, 2, d, 32)[:, :, 0]  # (B, H, D, N)
    _, values = layer.view(4, 3, 64, d).chunk(2, dim=2)  # how the backend splits K from V
    assert torch.equal(keys[b, h, :, 30], k[0, h])
    assert torch.equal(keys[0, h, :, 2], k[4, h])
    assert torch.equal(values[0, h, 1], v[3, h])
    rk, rv = layout.read(layer, slots)
    assert torch.equal(rk, k) and torch.equal(rv, v)


def test_split_last_layout_matches_flash_attention_split() -> None:
    layer = torch.zeros(4, 3, 32, 16).permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    layout = SplitLastLayout(SHAPE)
    slots = slots_of([3, 1], 32, 10, 40)
    k, v = torch.randn(30, 3, 8), torch.randn(30, 3, 8)
    layout.write(layer, slots, k, v)
    key_cache, value_cache = layer.transpose(1, 2).split(8, dim=-1)  # (B, N, H, D)
    assert torch.equal(key_cache[3, 10], k[0])
    assert torch.equal(value_cache[1, 7], v[29])
    rk, rv = layout.read(layer, slots)
    assert torch.equal(rk, k) and torch.equal(rv, v)


def test_runs_split_at_block_boundaries() -> None:
    layout = CpuLayout(SHAPE)
    runs = layout.runs(slots_of([5, 2, 7], 32, 20, 70))
    assert runs == [(5, 20, 0, 12), (2, 0, 12, 44), (7, 0, 44, 50)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "FLASHMLA"}, "not supported"),
        ({"cpu_isa": "amx"}, "not verified"),
        ({"head_size_v": 4}, "values 4"),
        ({"cache_dtype": "fp8"}, "quantized"),
    ],
)
def test_unsupported_layouts_are_refused(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"backend": "CPU_ATTN", "shape": SHAPE, "head_size_v": 8}
    args |= {"cache_dtype": "auto", "cpu_isa": "vec"} | kwargs
    with pytest.raises(UnsupportedKVLayoutError, match=message):
        layout_for(**args)  # type: ignore[arg-type]


def test_wrong_shape_or_strides_are_refused() -> None:
    with pytest.raises(UnsupportedKVLayoutError, match="expected a KV tensor"):
        layout_for("CPU_ATTN", SHAPE, 8, "auto", torch.zeros(4, 3, 16, 16), cpu_isa="vec")
    strided = torch.zeros(4, 32, 3, 16).transpose(1, 2)
    with pytest.raises(UnsupportedKVLayoutError, match="not contiguous"):
        layout_for("CPU_ATTN", SHAPE, 8, "auto", strided, cpu_isa="vec")
    assert isinstance(layout_for("FLASH_ATTN", SHAPE, 8, "auto", strided), SplitLastLayout)
