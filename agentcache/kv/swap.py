"""Moving a sequence's KV out of the page pool and back (mechanism for preemption).

    swap_out(seq) -> SwappedKV      copies tokens [0, n) of every layer to host tensors,
                                    then frees the sequence's pages (seq is empty after)
    swap_in(seq, swapped)           takes pages again and writes the copies back: tokens
                                    [0, n) read exactly what they read before swap_out

Which sequence is preempted and whether its KV is kept or recomputed is policy
(`agentcache/kv/preemption.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from agentcache.errors import OutOfPagesError
from agentcache.kv.pool import SequenceKV


@dataclass(frozen=True)
class SwappedKV:
    """A sequence's K/V held outside the pool: (L, n, Hkv, Dh) each, owned by this record."""

    keys: Tensor
    values: Tensor
    holes: Tensor | None = None  # `SequenceKV.holes` when swapped out

    @property
    def num_tokens(self) -> int:
        return int(self.keys.shape[1])

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


def swap_out(seq: SequenceKV) -> SwappedKV:
    """Copy the sequence's K/V out of the pool and free its pages."""
    keys, values = seq.gather_all(slice(None))  # copies, not views of the pool
    holes = seq.holes
    seq.free()
    return SwappedKV(keys, values, holes)


def pages_for(seq: SequenceKV, num_tokens: int) -> int:
    return -(-num_tokens // seq.pool.config.page_size)


def swap_in(seq: SequenceKV, swapped: SwappedKV) -> None:
    """Write `swapped` back into the empty `seq`. OutOfPagesError (nothing taken) when the
    pool has not the pages free; ValueError when `seq` holds tokens."""
    if seq.num_tokens:
        raise ValueError(f"swap_in needs an empty sequence, this one holds {seq.num_tokens}")
    need = pages_for(seq, swapped.num_tokens)
    if need - len(seq.table.pages) > seq.pool.num_free:  # (pages it holds already: reserved)
        c = seq.pool.config
        raise OutOfPagesError(
            f"swapping in {swapped.num_tokens} tokens needs {need} KV pages, only "
            f"{seq.pool.num_free} of {c.num_pages} are free"
        )
    seq.reserve(need)
    slots = seq.extend(swapped.num_tokens)
    seq.write_all(slots, swapped.keys, swapped.values)
    seq.holes = swapped.holes
