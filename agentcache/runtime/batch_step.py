"""One decode step for many sequences: projections and MLPs batched, attention per sequence
over its own pages, read in place (`decode.dense.paged_attention`).

    rows      [seq 0][seq 1] ... [seq B-1][pad ... ]      B real rows, padded (`CallRule`)
    embed     (R, D)
    layer l   project (R, H, Dh) -> write row b's k/v at seq b's new slot
              attention row b over seq b's slot runs (its window's, on a windowed layer)
              finish (R, D): o_proj + MLP of every row
    logits    (B, V)

A CPU matmul picks its kernel, and so its summation order, by the row count and the threads,
so a row's bits may change with the size of the call it is in. Decode rows therefore go
through every matrix product in calls `call_rule` picks for this CPU: where a probe of the
model's weights finds every multiple of 4 rows (up to 32) gives each row the same bits, rows
are padded to a multiple of 4 and run in calls of up to 32; where that holds from 16 rows on
(CPUs whose matmul takes another kernel for fewer rows), in calls of 16 to 32; elsewhere
every call carries exactly 16 rows, padded, and in a call of a fixed size a row's bits do
not depend on the other rows or on its place among them (`tests/runtime/test_batch_step.py`
checks it on the model's shapes, with 1 and 2 threads). A sequence's logits are then the
same bits in any batch, and in a batch of itself alone (what a preempted turn's recompute
replays). Padding rows attend nothing (their attention output is zero) and their logits
are dropped. The scheduler feeds a turn that is alone in its step through the one-sequence
step instead, which is faster (a one-row matmul reads the weights once).

The reference is `decode.dense.dense_step`, one sequence at a time; the two agree to fp32
rounding (a one-row matmul sums in another order).

Layout: attention sums over keys in the order it reads them, so its bits depend on where a
sequence's pages lie. Both steps here read a layer's context in place when its slots are one
run in token order (pages in ascending order, as a sequence admitted with all its pages gets
them) and otherwise from a token-order copy (`layer_reads`): a sequence whose pages were taken
as it went, beside others, or given back and taken again (preemption), gets the bits it gets
on consecutive pages. That rule is a read plan (`TokenOrderReads`, `decode.dense.ReadPlan`);
`one_step` is `dense_step` over it: the same bits on a sequence in token order, tested.

`fused_step` is the batched step with prefill chunks' rows beside the decode rows (the
scheduler's chunked prefill, `runtime/chunked.py`): one pass through the layers for all of
them, each chunk's rows through the matrix products in a call of their own, so the decode
rows keep the bits they get without the chunks, and a chunk gets the bits it gets with
nothing beside it; attention stays per sequence. Its reference for the chunks is
`reuse.base.compute_subset` (to fp32 rounding, tested).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from agentcache.decode.base import StepRow
from agentcache.decode.dense import PlanRow, ReadPlan, dense_step, paged_attention
from agentcache.kv.pool import SequenceKV
from agentcache.model.attention import attention
from agentcache.model.llama import LayerWeights, LlamaForward
from agentcache.reuse.base import context_reader

ROW_BLOCK = 4  # where one call may carry any multiple of 4 rows: decode rows padded to it
ROW_CAP = 32  # ... up to this many rows per call (the sizes the probe checks)
ROW_CHUNK = 16  # elsewhere: calls of at least (or, failing that, exactly) this many rows


@dataclass(frozen=True)
class CallRule:
    """How a step's decode rows go through each matrix product: padded to a multiple of
    `block`, in calls of `cap` rows and one of the rest, itself padded to `floor` rows at
    least (0: to `block`). A row's bits are the same in every call the rule makes, whatever
    rows sit beside it (`call_rule` picks a rule for which that holds on this CPU and thread
    count)."""

    block: int
    cap: int
    floor: int = 0

    def calls(self, rows: int) -> list[int]:
        """The call sizes that carry `rows` decode rows, padding included."""
        padded = max(self.block, -(-rows // self.block) * self.block)
        whole, rest = divmod(padded, self.cap)
        return [self.cap] * whole + ([max(rest, self.floor)] if rest else [])


ANY_MULTIPLE = CallRule(ROW_BLOCK, ROW_CAP)
FROM_CHUNK = CallRule(ROW_BLOCK, ROW_CAP, ROW_CHUNK)  # calls of 16 to 32 rows
FIXED = CallRule(ROW_CHUNK, ROW_CHUNK)
_RULES: dict[tuple[object, ...], CallRule] = {}


def call_rule(forward: LlamaForward) -> CallRule:
    """`ANY_MULTIPLE` where a probe of the forward's own weights finds each row of a matmul the
    same bits in calls of every multiple of `ROW_BLOCK` rows up to `ROW_CAP` (the matmul picks
    its kernel, and so its summation order, by the row count and the threads: some CPUs keep
    rows apart across those sizes, others do not); else `FROM_CHUNK` where that holds from
    `ROW_CHUNK` rows up (a CPU whose matmul takes another kernel below: one call then carries
    up to 32 rows at about the cost of 16, where `FIXED` would make two); else `FIXED`: in a
    call of one fixed size a row's bits do not depend on the other rows or its place among
    them, on any CPU (tested). Probed once per weight shapes and thread count."""
    mats = _matrices(forward)
    key = (tuple((w.shape, w.dtype, b is not None) for w, b in mats), torch.get_num_threads())
    if key not in _RULES:
        rules = (rule for rule in (ANY_MULTIPLE, FROM_CHUNK) if _rows_kept_apart(mats, rule))
        _RULES[key] = next(rules, FIXED)
    return _RULES[key]


def layer_matrices(w: LayerWeights) -> list[tuple[Tensor, Tensor | None]]:
    """The weights (and biases) a decode row goes through in one layer, in step order: q, k,
    v, o, gate, up, down (`benchmarks/server/step_bound.py` times them)."""
    return [(w.wq, w.bq), (w.wk, w.bk), (w.wv, w.bv), (w.wo, None), (w.w_gate, None),
            (w.w_up, None), (w.w_down, None)]  # fmt: skip


def _matrices(forward: LlamaForward) -> list[tuple[Tensor, Tensor | None]]:
    """Every distinct weight (and bias) shape a decode row goes through: one layer's (the
    others repeat them) and the head."""
    mats = [*layer_matrices(forward.weights.layers[0]), (forward.weights.lm_head, None)]
    seen, out = set(), []
    for m, bias in mats:
        if (key := (m.shape, bias is not None)) not in seen:
            seen.add(key)
            out.append((m, bias))
    return out


def _rows_kept_apart(mats: list[tuple[Tensor, Tensor | None]], rule: CallRule) -> bool:
    """Whether rows 0..n-1 and the last n of a `rule.cap`-row matmul come out the same bits in
    a call of their own n rows, for every size n of a call of `rule` (each multiple of its
    block from its floor up), for each weight."""
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for w, bias in mats:
            x = torch.randn(rule.cap, w.shape[1], generator=g).to(w.dtype)
            full = F.linear(x, w, bias)
            for n in range(max(rule.floor, rule.block), rule.cap, rule.block):
                head, tail = F.linear(x[:n], w, bias), F.linear(x[-n:], w, bias)
                if not (torch.equal(head, full[:n]) and torch.equal(tail, full[-n:])):
                    return False
    return True


Read = tuple[int, int] | Tensor  # a run [start, end) of slots in token order, or slots to copy


def layer_reads(forward: LlamaForward, seq: SequenceKV) -> list[Read]:
    """What each layer's decode query reads of `seq`: its slots (all, or a sliding window's
    last W) as one run when they are consecutive in token order, else the slots in token order."""
    slots = seq.slots()
    pages = seq.table.pages
    ordered = all(b - a == 1 for a, b in itertools.pairwise(pages))
    whole: Read = (int(slots[0]), int(slots[-1]) + 1) if ordered and len(slots) else slots
    n = seq.num_tokens
    reads: list[Read] = []
    windows: dict[int, Read] = {}
    for la in forward.spec.layers:
        w = la.window
        if w is None or w >= n:
            reads.append(whole)
            continue
        if w not in windows:
            part = slots[-w:]
            run = bool(torch.all(torch.diff(part) == 1))
            windows[w] = (int(part[0]), int(part[-1]) + 1) if run else part
        reads.append(windows[w])
    return reads


def attend(q: Tensor, keys: Tensor, values: Tensor, read: Read, scale: float) -> Tensor:
    """One row's attention (1, H*Dh) over `read` of a pool layer `keys`/`values` (N, Hkv, Dh):
    in place for a run, else over a token-order copy laid out as a run is (head-major)."""
    if isinstance(read, tuple):
        return paged_attention(q, keys, values, [read], scale)
    n = read.shape[0]
    # one index_select along a head's run of slots (the pool is stored head-major): the same
    # copy as keys[read] made head-major, in about a sixth of the time
    k = keys.transpose(0, 1).index_select(1, read).transpose(0, 1)  # (n, Hkv, Dh), head-major
    v = values.transpose(0, 1).index_select(1, read).transpose(0, 1)
    return paged_attention(q, k, v, [(0, n)], scale)


class TokenOrderReads(ReadPlan[Read]):
    """Each layer's context as one run when its slots are consecutive in token order, else a
    token-order copy (`layer_reads`, `attend`): the same bits in any page layout."""

    def reads(self, forward: LlamaForward, seq: SequenceKV) -> list[Read]:
        return layer_reads(forward, seq)

    def attend(self, q: Tensor, keys: Tensor, values: Tensor, read: Read, scale: float) -> Tensor:
        return attend(q, keys, values, read, scale)


TOKEN_ORDER = TokenOrderReads()


def one_step(forward: LlamaForward, seq: SequenceKV, token: int, position: int) -> Tensor:
    """`decode.dense.dense_step` over `TokenOrderReads`: alone, the scheduler's step."""
    return dense_step(forward, seq, token, position, TOKEN_ORDER)


class DenseRow(PlanRow):
    """A dense sequence's row in a batched step: `seq` already extended by `slot` (1,) for
    `token`, read at `TOKEN_ORDER` (the row `one_step` runs alone)."""

    def __init__(
        self, forward: LlamaForward, seq: SequenceKV, slot: Tensor, token: int, position: int
    ) -> None:
        super().__init__(forward, seq, slot, token, position, TOKEN_ORDER)


def dense_rows(
    forward: LlamaForward, seqs: Sequence[SequenceKV], slots: Tensor, tokens: Sequence[int],
    positions: Sequence[int],
) -> list[StepRow]:  # fmt: skip
    """One `DenseRow` per sequence: slots[b] (taken), tokens[b], positions[b] of seqs[b]."""
    b = len(seqs)
    if not slots.shape[0] == len(tokens) == len(positions) == b:
        raise ValueError(f"one slot, token and position per sequence, got {b}, "
                         f"{slots.shape[0]}, {len(tokens)}, {len(positions)}")  # fmt: skip
    return [DenseRow(forward, s, slots[i : i + 1], tokens[i], positions[i])
            for i, s in enumerate(seqs)]  # fmt: skip


def batched_dense_step(
    forward: LlamaForward, seqs: Sequence[SequenceKV], slots: Tensor, tokens: Sequence[int],
    positions: Sequence[int],
) -> Tensor:  # fmt: skip
    """Write tokens[b] at positions[b] into slots[b] of seqs[b], each sequence already extended
    by that one slot, for every b; the logits after each (B, V). For forwards where
    `decode.dense.reads_in_place` holds; the sequences share one pool."""
    if not seqs:
        raise ValueError("one slot, token and position per sequence, got 0 sequences")
    return fused_step(forward, seqs, slots, tokens, positions, ())[0]


@dataclass
class StepTimes:
    """Where batched steps' time went, in seconds, summed over steps (`batched_step`'s
    `times`): the attention of the decode rows of each kind (`StepRow.kind`: "dense" over a
    sequence's whole context, "sparse" over the pages its decoder selects, "verify" a verified
    decoder's dense pass), with the rows' own per-layer work (K/V writes, selection); the
    attention of the prefill chunks in the step; and the rest of the step (embedding, the
    matrix products of every row, norms, logits): what the rows share."""

    attention: dict[str, float] = field(default_factory=dict)
    chunks: float = 0.0
    rest: float = 0.0

    def add(self, other: StepTimes) -> None:
        for kind, s in other.attention.items():
            self.attend(kind, s)
        self.chunks += other.chunks
        self.rest += other.rest

    def attend(self, kind: str, seconds: float) -> None:
        self.attention[kind] = self.attention.get(kind, 0.0) + seconds

    def seconds(self) -> dict[str, float]:
        """Flat, for reports: `attention:<kind>`, `chunks`, `rest`."""
        out = {f"attention:{k}": v for k, v in sorted(self.attention.items())}
        return {**out, "chunks": self.chunks, "rest": self.rest}


@dataclass(frozen=True)
class ChunkRows:
    """A prefill chunk's rows in a fused step: tokens `ids` (n,) of `seq` at their indices
    `index` (n,) in it, sorted, which are also their positions; each row writes its K/V at its
    token's slot and attends causally over `seq`'s tokens 0..its index (loaded, written by
    earlier chunks, or by the rows before it), as `reuse.base.compute_subset` computes them."""

    seq: SequenceKV
    ids: Tensor
    index: Tensor


def fused_step(
    forward: LlamaForward, seqs: Sequence[SequenceKV], slots: Tensor, tokens: Sequence[int],
    positions: Sequence[int], chunks: Sequence[ChunkRows],
) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
    """`batched_step` of dense decode rows (`dense_rows`, B may be 0) and prefill chunks."""
    return batched_step(forward, dense_rows(forward, seqs, slots, tokens, positions), chunks)


def batched_step(
    forward: LlamaForward, rows: Sequence[StepRow], chunks: Sequence[ChunkRows] = (),
    times: StepTimes | None = None,
) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
    """One decode step of `rows` (B may be 0; dense rows `DenseRow`, a sparse decoder's its
    `begin_step` row, a verified decoder's dense pass a row of several tokens) with prefill
    chunks' rows beside them in the same projections and MLPs: the decode logits (N, V), N
    the rows' tokens (`StepRow.width`; B when each has one), in the rows' order, and each
    chunk's logits after its last token (V,). Each chunk is of its own sequence, not one of
    the rows'. Every row is run to its `end`.

        rows   [decode 0..N-1][pad][chunk 0][chunk 1]    decode rows in `call_rule`'s calls

    The decode rows go through each matrix product in the calls of `call_rule` and each chunk
    in a call of its own, so the decode rows get the bits they get without the chunks, in any
    company and order, and a chunk's rows the bits they get with nothing beside them (the row
    invariance the batched step rests on). Attention stays per sequence: a
    decode row's is its own (`StepRow.attend`: a dense row over its sequence's reads, a sparse
    row over the pages its decoder selects), a chunk's rows over its sequence's K/V in token
    order under the causal mask (`model.attention.attention` with the rows' indices, the
    forward's own attention: the same bits as the chunk run on its own, given the same q, k,
    v). `times`, when given, is added the step's seconds by part (`StepTimes`)."""
    f = forward
    clock = _Clock(times)
    if not rows and not chunks:
        raise ValueError("a fused step needs a decode row or a chunk")
    spans = list(itertools.pairwise(itertools.accumulate((r.width for r in rows), initial=0)))
    b = spans[-1][1] if spans else 0  # the decode rows' tokens
    parts: list[tuple[int, int]] = []  # [start, end) of the rows of each matmul call
    width = 0
    for n in call_rule(f).calls(b) if b else ():
        parts.append((width, width + n))
        width += n
    decode_width = width
    ids = [*(t for r in rows for t in r.tokens), *[0] * (width - b)]
    pos = [*(p for r in rows for p in r.positions), *[0] * (width - b)]
    starts = []
    for c in chunks:
        n = len(c.ids)
        if not n or len(c.index) != n:
            raise ValueError(f"a chunk needs one index per token, got {n} and {len(c.index)}")
        starts.append(width)
        parts.append((width, width + n))
        ids += c.ids.tolist()
        pos += c.index.tolist()
        width += n
    hidden = f.embed(torch.tensor(ids))
    hidden[b:decode_width] = 0.0  # padding rows: zero in, attention zero, logits dropped
    position = torch.tensor(pos)
    chunk_slots = [c.seq.slots()[c.index] for c in chunks]
    contexts = [context_reader(c.seq) for c in chunks]
    attn = torch.zeros(width, f.config.num_heads * f.config.head_dim, dtype=hidden.dtype)
    for layer in range(f.config.num_layers):
        projected = [f.project(layer, hidden[s:e], position[s:e]) for s, e in parts]
        q, k, v = (_cat([p[i] for p in projected]) for i in range(3))
        for c, s, cs in zip(chunks, starts, chunk_slots, strict=True):
            c.seq.write(layer, cs, k[s : s + len(c.ids)], v[s : s + len(c.ids)])
        for r, (s, e) in zip(rows, spans, strict=True):
            t0 = clock.start()
            attn[s:e] = r.attend(layer, q[s:e], k[s:e], v[s:e])
            clock.attention(r.kind, t0)
        window = f.spec.layers[layer].window
        for c, s, context in zip(chunks, starts, contexts, strict=True):
            t0 = clock.start()
            kc, vc = context(layer)
            e = s + len(c.ids)
            attn[s:e] = attention(q[s:e], kc, vc, c.index, f.scale, window)
            clock.chunk(t0)
        hidden = _cat([f.finish(layer, hidden[s:e], attn[s:e]) for s, e in parts])
    for r in rows:
        r.end()
    vocab = f.weights.lm_head.shape[0]
    calls = parts[: len(parts) - len(chunks)]
    decode = (
        _cat([f.logits(hidden[s:e]) for s, e in calls])[:b] if b else hidden.new_zeros(0, vocab)
    )
    last = [f.logits(hidden[s + len(c.ids) - 1 : s + len(c.ids)])[0] for c, s in
            zip(chunks, starts, strict=True)]  # fmt: skip
    clock.finish()
    return decode, last


class _Clock:
    """`batched_step`'s timing into a `StepTimes`, from when it is made; with none, it reads
    no clock."""

    def __init__(self, times: StepTimes | None) -> None:
        self.times, self.parts = times, 0.0
        self.began = self.start()

    def start(self) -> float:
        return time.perf_counter() if self.times is not None else 0.0

    def attention(self, kind: str, t0: float) -> None:
        if self.times is not None:
            dt = time.perf_counter() - t0
            self.times.attend(kind, dt)
            self.parts += dt

    def chunk(self, t0: float) -> None:
        if self.times is not None:
            dt = time.perf_counter() - t0
            self.times.chunks += dt
            self.parts += dt

    def finish(self) -> None:
        if self.times is not None:
            self.times.rest += time.perf_counter() - self.began - self.parts


def _cat(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
