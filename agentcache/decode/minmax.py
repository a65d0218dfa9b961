"""MinMax page metadata (Quest): per layer, KV head and page, the key's min and max per dim.

    kmin / kmax : (L, Hkv, max_pages, Dh)   page p covers tokens [p * page_size, (p+1) * page_size)

The metadata stays in the fast tier for every page, resident or not, so any page can be scored
without reading its keys. For a query q the page's score bounds q . k over its keys from above:

    score(page) = sum_d max(q_d * max_d, q_d * min_d) = relu(q) . max + min(q, 0) . min

(the second form, valid because max_d >= min_d, is two matmuls instead of an elementwise max).
"""

from __future__ import annotations

import torch
from torch import Tensor

GQA_COMBINES = ("sum", "max")


class MinMaxMeta:
    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, max_pages: int, page_size: int
    ) -> None:
        shape = (num_layers, num_kv_heads, max_pages, head_dim)
        self.kmin = torch.full(shape, float("inf"))
        self.kmax = torch.full(shape, float("-inf"))
        self.page_size = page_size
        self.num_tokens = 0

    @property
    def num_pages(self) -> int:
        return -(-self.num_tokens // self.page_size)

    @property
    def nbytes(self) -> int:
        return self.kmin.nbytes + self.kmax.nbytes

    def build(self, keys: Tensor) -> None:
        """Metadata of a prefilled sequence: keys (L, T, Hkv, Dh). Full pages are reduced on
        a view of `keys` (no padded copy), the last partial page on its own tokens."""
        n_layers, t, hkv, dh = keys.shape
        full = t // self.page_size
        k = keys.permute(0, 2, 1, 3)  # (L, Hkv, T, Dh), a view
        if full:
            body = k[:, :, : full * self.page_size].reshape(n_layers, hkv, full, self.page_size, dh)
            torch.amin(body, 3, out=self.kmin[:, :, :full])
            torch.amax(body, 3, out=self.kmax[:, :, :full])
        if t > full * self.page_size:
            tail = k[:, :, full * self.page_size :]
            self.kmin[:, :, full] = tail.amin(2)
            self.kmax[:, :, full] = tail.amax(2)
        self.num_tokens = t

    def append(self, layer: int, k: Tensor, token_index: int) -> None:
        """Fold the key (Hkv, Dh) of token `token_index` into its page at `layer`."""
        p = token_index // self.page_size
        torch.minimum(self.kmin[layer, :, p], k, out=self.kmin[layer, :, p])
        torch.maximum(self.kmax[layer, :, p], k, out=self.kmax[layer, :, p])
        self.num_tokens = max(self.num_tokens, token_index + 1)

    def append_tokens(self, layer: int, k: Tensor, start: int) -> None:
        """Fold the keys (n, Hkv, Dh) of the n tokens from `start` into their pages at
        `layer`: `append` of each, in one reduction per bound."""
        keys = k.transpose(0, 1)  # (Hkv, n, Dh)
        pages = torch.arange(start, start + k.shape[0]) // self.page_size
        index = pages[None, :, None].expand_as(keys)
        self.kmin[layer].scatter_reduce_(1, index, keys, "amin")
        self.kmax[layer].scatter_reduce_(1, index, keys, "amax")
        self.num_tokens = max(self.num_tokens, start + k.shape[0])

    def truncate(self, num_tokens: int) -> None:
        """Forget tokens from `num_tokens` on. Pages left empty are reset; the last kept page
        keeps bounds that may cover forgotten keys too (looser, still upper bounds)."""
        keep = -(-num_tokens // self.page_size)
        self.kmin[:, :, keep:] = float("inf")
        self.kmax[:, :, keep:] = float("-inf")
        self.num_tokens = num_tokens

    def scores(self, layer: int, q: Tensor, heads: Tensor | None, combine: str) -> Tensor:
        """Page scores (n, P) for query heads grouped per KV head: q (Hkv, G, Dh).

        `heads` (n,) restricts scoring to some KV heads (None: all). The G query heads of a KV
        head are combined by `combine`: "sum" of their bounds or their "max".
        """
        p = self.num_pages
        hi, lo = self.kmax[layer, :, :p], self.kmin[layer, :, :p]  # (Hkv, P, Dh)
        if heads is not None:
            q, hi, lo = q[heads], hi[heads], lo[heads]
        s = q.clamp(min=0) @ hi.transpose(1, 2) + q.clamp(max=0) @ lo.transpose(1, 2)  # (n, G, P)
        return s.sum(1) if combine == "sum" else s.amax(1)


def reference_scores(q: Tensor, kmin: Tensor, kmax: Tensor) -> Tensor:
    """Literal Quest bound, elementwise: q (G, Dh), kmin/kmax (P, Dh) -> (G, P)."""
    return torch.maximum(q[:, None] * kmax[None], q[:, None] * kmin[None]).sum(-1)
