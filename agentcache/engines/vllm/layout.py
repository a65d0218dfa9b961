"""Per-token access to vLLM's paged KV buffers, for the layouts the connector knows exactly.

vLLM 0.32 hands every attention layer one tensor of logical shape [B, H, N, C] (blocks, KV heads,
tokens of a block, content), C = 2 * head_size. What C means depends on the attention backend:

    CPU_ATTN      memory per block and head is [keys | values] (the backend views it as
      isa "vec"   [B, H, 2N, D] and splits dim 2), and C is not per token: the "vec" kernel
                  (x86, block size a multiple of 32, no AMX/bf16) keeps the keys transposed,
                  [D, N], and the values [N, D]. Measured against agentcache's own forward
                  on the default model: reading keys as [N, D] is off by ~20 (tests pin it).
                  The other CPU kernels (amx, neon, vec16, ...) are not verified: refused.
    FLASH_ATTN,   C = [key (D) | value (D)] of one token: k = kv[b, :, n, :D], v = kv[b, :, n, D:]
    TRITON_ATTN,  (the backend splits the last axis at head_size); strides may be permuted
    FLEX_ATTENTION

Anything else (MLA's latent cache, quantized caches, K and V of different sizes, a backend
not listed) is refused: reading it with the wrong view would serve wrong KV silently.
Slots are vLLM's: slot = block_id * block_size + offset.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from agentcache.engines.vllm import UnsupportedKVLayoutError

CPU_BACKENDS = ("CPU_ATTN",)
CPU_ISAS = ("vec",)  # CPU attention kernels whose block interior is verified
SPLIT_LAST_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION")


@dataclass(frozen=True)
class KVShape:
    num_kv_heads: int
    head_size: int
    block_size: int


class KVLayout(ABC):
    """Reads and writes the K/V of given slots in one layer's paged tensor."""

    name: str

    def __init__(self, shape: KVShape) -> None:
        self.shape = shape

    def check(self, layer: Tensor) -> None:
        s = self.shape
        want = (s.num_kv_heads, s.block_size, 2 * s.head_size)
        if layer.dim() != 4 or tuple(layer.shape[1:]) != want:
            raise UnsupportedKVLayoutError(
                f"{self.name}: expected a KV tensor [blocks, {want[0]}, {want[1]}, {want[2]}], "
                f"got {list(layer.shape)}"
            )

    def runs(self, slots: Tensor) -> list[tuple[int, int, int, int]]:
        """Split `slots` into runs of consecutive offsets in one block: (block, offset, i, j)
        meaning slots[i:j] are offsets offset..offset+j-i of `block`. Slicing a run is ~100x
        faster than advanced indexing per token."""
        bs = self.shape.block_size
        blocks, offsets = (slots // bs).tolist(), (slots % bs).tolist()
        out: list[tuple[int, int, int, int]] = []
        for i, (b, o) in enumerate(zip(blocks, offsets, strict=True)):
            if out and out[-1][0] == b and out[-1][1] + (i - out[-1][2]) == o:
                first = out[-1]
                out[-1] = (first[0], first[1], first[2], i + 1)
            else:
                out.append((b, o, i, i + 1))
        return out

    def read(self, layer: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """K and V of `slots` (n,): two (n, H, D) copies."""
        s = self.shape
        k = torch.empty(len(slots), s.num_kv_heads, s.head_size, dtype=layer.dtype)
        v = torch.empty_like(k)
        for b, o, i, j in self.runs(slots):
            k[i:j], v[i:j] = self.read_run(layer, b, o, o + j - i)
        return k, v

    def write(self, layer: Tensor, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """Write K and V (n, H, D) into `slots` (n,): one copy to the layer's device and dtype,
        then per-run slices (no host-to-device copy per run)."""
        k, v = (x.to(device=layer.device, dtype=layer.dtype) for x in (k, v))
        for b, o, i, j in self.runs(slots):
            self.write_run(layer, b, o, o + j - i, k[i:j], v[i:j])

    @abstractmethod
    def read_run(self, layer: Tensor, block: int, start: int, end: int) -> tuple[Tensor, Tensor]:
        """K and V (n, H, D) of offsets [start, end) of one block."""

    @abstractmethod
    def write_run(
        self, layer: Tensor, block: int, start: int, end: int, k: Tensor, v: Tensor
    ) -> None: ...


class CpuLayout(KVLayout):
    """vLLM's CPU attention, "vec" kernel: [B, H, N, 2D] whose memory per block and head is
    keys [D, N] (transposed) then values [N, D]."""

    name = "CPU_ATTN/vec"

    def check(self, layer: Tensor) -> None:
        super().check(layer)
        if not layer.is_contiguous():
            raise UnsupportedKVLayoutError(
                f"{self.name}: the KV tensor is not contiguous (strides {layer.stride()}); the "
                "CPU backend's K-then-V block interior cannot be viewed per token"
            )

    def _keys(self, layer: Tensor) -> Tensor:  # (B, H, D, N)
        s = self.shape
        return layer.view(-1, s.num_kv_heads, 2, s.head_size, s.block_size)[:, :, 0]

    def _values(self, layer: Tensor) -> Tensor:  # (B, H, N, D)
        s = self.shape
        return layer.view(-1, s.num_kv_heads, 2, s.block_size, s.head_size)[:, :, 1]

    def read_run(self, layer: Tensor, block: int, start: int, end: int) -> tuple[Tensor, Tensor]:
        k = self._keys(layer)[block, :, :, start:end].permute(2, 0, 1)  # (n, H, D)
        v = self._values(layer)[block, :, start:end].transpose(0, 1)
        return k, v

    def write_run(
        self, layer: Tensor, block: int, start: int, end: int, k: Tensor, v: Tensor
    ) -> None:
        self._keys(layer)[block, :, :, start:end] = k.permute(1, 2, 0)
        self._values(layer)[block, :, start:end] = v.transpose(0, 1)


class SplitLastLayout(KVLayout):
    """FlashAttention-style: C = [key | value] of one token; any stride permutation."""

    name = "split-last"

    def read_run(self, layer: Tensor, block: int, start: int, end: int) -> tuple[Tensor, Tensor]:
        d = self.shape.head_size
        rows = layer[block, :, start:end].transpose(0, 1)  # (n, H, 2D)
        return rows[..., :d], rows[..., d:]

    def write_run(
        self, layer: Tensor, block: int, start: int, end: int, k: Tensor, v: Tensor
    ) -> None:
        layer[block, :, start:end] = torch.cat([k, v], dim=-1).transpose(0, 1)


def layout_for(
    backend: str,
    shape: KVShape,
    head_size_v: int,
    cache_dtype: str,
    layer: Tensor | None = None,
    cpu_isa: str | None = None,
) -> KVLayout:
    """The layout of `backend`'s KV tensor, or `UnsupportedKVLayoutError` saying why not."""
    if head_size_v != shape.head_size:
        raise UnsupportedKVLayoutError(
            f"keys have {shape.head_size} dims but values {head_size_v}; the connector stores "
            "K and V of one size"
        )
    if cache_dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise UnsupportedKVLayoutError(
            f"kv cache dtype {cache_dtype!r} is quantized; the connector stores unquantized K/V "
            "(run vLLM with kv_cache_dtype='auto')"
        )
    layout: KVLayout
    if backend in CPU_BACKENDS:
        if cpu_isa not in CPU_ISAS:
            raise UnsupportedKVLayoutError(
                f"vLLM's CPU attention kernel {cpu_isa!r} keeps KV in a block layout the "
                f"connector has not verified; verified: {', '.join(CPU_ISAS)} (float32 on x86)"
            )
        layout = CpuLayout(shape)
    elif backend in SPLIT_LAST_BACKENDS:
        layout = SplitLastLayout(shape)
    else:
        known = ", ".join(CPU_BACKENDS + SPLIT_LAST_BACKENDS)
        raise UnsupportedKVLayoutError(
            f"attention backend {backend!r} is not supported by agentcache's connector "
            f"(it would read its KV with the wrong view); supported: {known}"
        )
    if layer is not None:
        layout.check(layer)
    return layout


def slots_of(block_ids: list[int], block_size: int, start: int, end: int) -> Tensor:
    """vLLM slots of tokens [start, end) of a request whose blocks are `block_ids`."""
    idx = torch.arange(start, end)
    blocks = torch.tensor(block_ids, dtype=torch.int64)
    if end > len(block_ids) * block_size:
        raise ValueError(f"tokens up to {end} need more than {len(block_ids)} blocks")
    return blocks[idx // block_size] * block_size + idx % block_size
