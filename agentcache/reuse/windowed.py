"""Which reused K/V a sliding-window layer loads: only the rows some query can read.

A query at context index i on a layer with window W reads keys j with i - W < j <= i. The
queries a selective prefill may run are known before any layer does (`reach`: the tokens it
may compute, the last prompt token always among them, so decode's first query's window too):

    reach    :   . . . . . . . . . . . . . q q . . . . q        (q: may be computed)
    W = 4    :                     # # # # # #     # # # #      rows loaded at this layer
    loaded   : everything reused, on a global layer

A reused row outside every window is neither loaded nor counted, and the sequence holds no K/V
for it at that layer: `SequenceKV.holes` marks those tokens, so nothing stores them as KV.
Later tokens sit past the last prompt token, whose window covers every row they read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.model.attention import AttentionSpec


def within_window(reach: Tensor, window: int) -> Tensor:
    """(T,) bool: rows j some token of `reach` (T,) reads through a window of `window`, i.e.
    a reaching token lies in [j, j + window)."""
    t = len(reach)
    upto = reach.to(torch.int64).cumsum(0)  # reaching tokens in [0, k]
    j = torch.arange(t)
    last = torch.clamp(j + window, max=t) - 1
    before = torch.where(j > 0, upto[(j - 1).clamp(min=0)], 0)
    return upto[last] - before > 0  # reaching tokens in [j, last]


def layer_loads(spec: AttentionSpec, load: Tensor, reach: Tensor) -> Tensor | None:
    """(L, T) bool: the rows of `load` (T,) each layer lands; None when every layer lands
    all of them (no sliding window leaves a row out)."""
    windows = {w for w in (la.window for la in spec.layers) if w is not None}
    if not windows:
        return None
    read = {w: load & within_window(reach, w) for w in windows}
    if all(torch.equal(r, load) for r in read.values()):
        return None
    return torch.stack([load if la.window is None else read[la.window] for la in spec.layers])
