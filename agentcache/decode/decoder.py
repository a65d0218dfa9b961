"""Sparse decode over per-head pages: MinMax scoring, per-head top-K + sink + newest pages,
periodic rerank with incremental promotion, attention batched over heads.

Pages attended by KV head h at a step (logical page ids, in token order):

    [0 (sink)] + sel[h] (top-K at h's last rerank, -1 padded) + [tail_start[h] .. newest]

At a rerank the newest `recent_pages` pages form the tail and the top-K is taken among pages
1 .. tail_start-1; pages opened since then join the tail, so nothing recent is skipped.
A streaming head (HeadPlan.streaming) is never scored and attends

    [0 (sink)] + [window_start .. newest],  window_start = max(1, pages - window_pages)

its window sliding as pages open; offloaded, it holds exactly those pages in the fast tier.

A sliding-window layer (the model's attention spec, model/attention.py) is decoded exactly:
its queries read only the last W tokens, so every KV head of it attends the pages holding them,
masked to those W tokens; it is never scored, streamed or offloaded (its plan is dense there).
"""

from __future__ import annotations

import time
import warnings

import torch
from torch import Tensor

from agentcache.decode.base import Decoder, StepRow, row_logits, row_step
from agentcache.decode.config import DecodeConfig
from agentcache.decode.kernels import last_tokens_attention, page_attention, top_p_pages
from agentcache.decode.minmax import MinMaxMeta
from agentcache.decode.policies import HeadPlan
from agentcache.decode.stats import DecodeStats
from agentcache.decode.store import HeadPagedKV
from agentcache.model.attention import attention
from agentcache.model.llama import LlamaForward

PAGE_TOKENS = 16  # tokens per page of a sparse decoder's head-paged KV


def rankable_pages(num_pages: int, recent: int) -> int:
    """The pages of a sequence of `num_pages` a head can rank: all but the sink and the tail."""
    return max(1, num_pages - 1 - recent)


def clamp_budget(budget: int, num_pages: int, recent: int) -> tuple[int, bool]:
    """Budgets beyond the pages a sequence can rank (all but sink and tail) are clamped."""
    most = rankable_pages(num_pages, recent)
    if budget > most:
        warnings.warn(
            f"decode budget of {budget} pages exceeds the {most} rankable pages of this "
            f"sequence; clamped to {most} (every page is attended)",
            stacklevel=3,
        )
        return most, True
    return budget, False


class SparseDecoder(Decoder):
    """One sequence's decode state. Built from its prefilled K/V (L, T, Hkv, Dh); `step` appends
    a token and returns the logits after it."""

    def __init__(
        self,
        forward: LlamaForward,
        plan: HeadPlan,
        config: DecodeConfig,
        keys: Tensor,
        values: Tensor,
        max_tokens: int,
    ) -> None:
        c = forward.config
        page = PAGE_TOKENS
        self.f, self.config, self.page = forward, config, page
        self.group = c.num_heads // c.num_kv_heads
        t = keys.shape[1]
        max_pages = -(-max_tokens // page)
        self.recent = config.recent_pages
        self.budget, self.clamped = clamp_budget(config.budget_pages, max_pages, self.recent)
        self.interval = plan.rerank_interval.clone()
        no_heads = torch.zeros_like(plan.offload)
        self.streaming = no_heads if plan.streaming is None else plan.streaming.clone()
        # sliding-window layers: each head attends its window's pages, no selection
        self.windows = [forward.spec.window(i) for i in range(c.num_layers)]
        windowed = torch.tensor([w is not None for w in self.windows])
        self.streaming[windowed] = False
        self.window = plan.window_pages
        # between two reranks a head's tail grows by the tokens of `interval` steps, and under
        # verified decoding by a round's last draft, which its pass appends, once per round
        # of `verify` steps (`advance`'s bonus)
        between = self.interval + (-(-self.interval // config.verify) if config.verify else 0)
        capacity = torch.where(
            self.streaming,
            1 + self.window,
            1 + self.budget + self.recent + (-(-between // page)),
        )
        offload = plan.offload & (capacity < max_pages) & ~windowed[:, None]
        self.kv = HeadPagedKV(c.head_dim, page, max_pages, capacity, offload)
        self.window_offloaded = [
            torch.nonzero(offload[i] & self.streaming[i]).flatten() for i in range(c.num_layers)
        ]
        self.kv.load(keys, values)
        # per layer whose heads are all offloaded with the same slots: (its first arena row,
        # slots per head, the heads' host rows); attention reads their slots in place
        self.in_place = True  # False: every layer gathers its pages (the reference)
        self._slots: list[tuple[int, int, Tensor] | None] = [None] * c.num_layers
        for i in range(c.num_layers):
            cap = self.kv.capacity[i]
            if bool(offload[i].all()) and bool((cap == cap[0]).all()):
                first, host = int(self.kv.region[i, 0]), self.kv.off_row[i]
                self._slots[i] = (first, int(cap[0]), host)
        self.meta = MinMaxMeta(c.num_layers, c.num_kv_heads, c.head_dim, max_pages, page)
        self.meta.build(keys)
        n_pages = -(-t // page)
        self.sel = torch.full((c.num_layers, c.num_kv_heads, self.budget), -1, dtype=torch.int64)
        self.tail_start = torch.full(
            (c.num_layers, c.num_kv_heads), max(1, n_pages - self.recent), dtype=torch.int64
        )
        self.window_start = max(1, n_pages - self.window)
        # per layer: the distinct rerank intervals of its heads; a count of its reranks (sel
        # and tail_start change only there); its attended pages, cached (`_layer_pages`)
        self._intervals = [sorted(set(self.interval[i].tolist())) for i in range(c.num_layers)]
        self._reranked = [0] * c.num_layers
        self._cached: list[tuple[tuple[int, ...], Tensor, Tensor, Tensor] | None]
        self._cached = [None] * c.num_layers
        self.steps = 0
        self._reranks = 0
        self._rerank_s = 0.0
        self._rerank_steps = 0
        self._promoted = 0
        self._initial_promoted = self._place_initial(n_pages)
        self._passes = self._drafted = self._accepted = self._host_read = self._selected = 0
        self.verify_skipped = False

    def _place_initial(self, n_pages: int) -> int:
        """Offloaded heads start with the sink and the tail resident (streaming heads: their
        window); the first top-K comes at the first step, when a query exists."""
        promoted = 0
        sink = torch.zeros(1, dtype=torch.int64)
        for layer, heads in enumerate(self.kv.offloaded_heads):
            stream = self.streaming[layer, heads]
            for group, first in ((heads[~stream], self.tail_start[layer, 0]),
                                 (heads[stream], self.window_start)):  # fmt: skip
                if len(group):
                    wanted = torch.cat([sink, torch.arange(int(first), n_pages)])
                    promoted += self.kv.place(layer, group, wanted.expand(len(group), -1))
        return promoted

    def stats(self) -> DecodeStats:
        return DecodeStats(
            self.steps, self.kv.fast_tier_bytes, self.meta.nbytes, self.kv.host_tier_bytes,
            self._reranks, self._rerank_s, self._rerank_steps, self._promoted,
            self._initial_promoted, self._promoted * self.kv.page_bytes, self.kv.rows_synced,
            self.budget, self.clamped, self._passes, self._drafted, self._accepted,
            self._host_read, self.verify_skipped, self._selected, int(self.streaming.sum()),
            self.window,
        )  # fmt: skip

    def feed(self, token: int, position: int, room: int) -> Tensor:
        return self.step(token, position)

    def step(self, token: int, position: int) -> Tensor:
        """Append `token` at `position`; returns the logits after it (V,): `begin_step`'s row
        run alone (`row_step`), the reference of this decoder's rows in a batched step."""
        return row_step(self.f, self._begin(token, position))

    def begin_step(
        self, forward: LlamaForward, token: int, position: int, room: int
    ) -> SparseRow | None:
        return self._begin(token, position) if forward is self.f else None

    def _begin(self, token: int, position: int) -> SparseRow:
        """Before the layers: the streaming window slides, the token's slot is taken."""
        self._promoted += self._slide()
        return SparseRow(self, token, position, self.kv.append_token())

    def attend_layer(
        self, layer: int, t: int, q: Tensor, k: Tensor, v: Tensor
    ) -> tuple[Tensor, int]:
        """One layer of a step for token index `t`: write its k/v (1, Hkv, Dh), fold them into
        the metadata, rerank the heads due with q (1, H, Dh), attend the selected pages.
        Returns the attention output (1, H*Dh) and the head-pages the rerank promoted."""
        self.kv.write(layer, t, k[0], v[0])
        self.meta.append(layer, k[0], t)
        qg = q[0].reshape(-1, self.group, q.shape[-1])  # (Hkv, G, Dh)
        promoted = self._rerank(layer, qg)
        self.kv.sync(layer)
        return self._attend(layer, qg), promoted

    def end_step(self, promoted: int) -> None:
        """After the layers: count the step and the head-pages its reranks `promoted`."""
        if self.steps == 0:
            self._initial_promoted += promoted
        elif self._offloaded_due():
            self._promoted += promoted
            self._rerank_steps += 1
        self.steps += 1

    def advance(
        self, token: int, position: int, draft: int, stop_ids: frozenset[int] = frozenset(),
        bonus: bool | None = None,
    ) -> list[int]:  # fmt: skip
        """Greedy self-speculative decoding: append `token` at `position`, draft up to `draft`
        tokens sparsely (stopping after a token in `stop_ids`), verify them with one dense pass.
        With `bonus` the pass covers the last draft too (unless it is a stop id), so that when
        dense agrees with every draft its own next token comes with them; by default when the
        decoder is made for verification (`DecodeConfig.verify`: its fast tier has room for the
        tokens the passes append).

        Returns the tokens dense greedy decoding emits after `token` (1..draft of them, or
        draft + 1 with the bonus): the drafted tokens dense agrees with, then dense's own token
        where they part or after the last. Afterwards the KV holds `token` and every returned
        token but the last, all with dense K/V."""
        if draft < 1:
            raise ValueError(f"draft must be >= 1 (got {draft})")
        start = self.kv.num_tokens
        fed, drafts = [token], []
        logits = self.step(token, position)
        while True:
            drafts.append(int(logits.argmax()))
            if len(drafts) == draft or drafts[-1] in stop_ids:
                break
            fed.append(drafts[-1])
            logits = self.step(drafts[-1], position + len(fed) - 1)
        if bonus is None:
            bonus = bool(self.config.verify)
        if bonus and drafts[-1] not in stop_ids:
            fed.append(drafts[-1])  # appended by the pass (`begin_verify`)
        return self.settle(fed, drafts, start, position)

    def settle(self, fed: list[int], drafts: list[int], start: int, position: int) -> list[int]:
        """The end of a round of `advance`: `fed` (the round's token, then every draft but the
        last, and the last one too for the bonus) from token index `start` and position
        `position`, all appended but the bonus's draft; `drafts` the sparse argmax after each.
        Verifies them with one dense pass and `accept`s."""
        return self.accept(drafts, start, self.verify(fed, start, position))

    def accept(self, drafts: list[int], start: int, logits: Tensor) -> list[int]:
        """A round's `drafts` against the dense pass's `logits` (n, V) over the tokens fed from
        token index `start` (`verify`, or its row run in a batched step; n = len(drafts) + 1
        when the pass covered the last draft): keeps the K/V of the tokens dense agrees with
        and returns the tokens dense greedy decoding emits (see `advance`)."""
        dense = logits.argmax(-1).tolist()
        agree = 0
        while agree < len(drafts) and dense[agree] == drafts[agree]:
            agree += 1
        self._drafted += len(drafts)
        self._accepted += agree
        if agree == len(drafts):
            return [*drafts, *dense[agree:]]  # and the bonus, when the pass covered the last
        self.kv.truncate(start + agree + 1)
        self.meta.truncate(start + agree + 1)
        return [*drafts[:agree], dense[agree]]

    def verify(self, tokens: list[int], start: int, position: int) -> Tensor:
        """Dense pass over `tokens` at token indices start.. and positions position.. (see
        `begin_verify`): attends every page of every head, overwrites their K/V (fast tier and
        host copy) with the dense values and returns the logits after each token (n, V): the
        `begin_verify` row run alone."""
        return row_logits(self.f, self.begin_verify(tokens, start, position))

    def begin_verify(self, tokens: list[int], start: int, position: int) -> VerifyRow:
        """The dense pass of `verify` as a row of several tokens (`StepRow`), to run alone or
        in a batched step. `tokens` are the last ones appended, from token index `start`, and
        may hold one more, appended here (a round's last draft, whose K/V only the pass
        computes)."""
        n, have = len(tokens), self.kv.num_tokens - start
        if n == have + 1:
            self._promoted += self._slide()
            self.kv.append_token()
        elif n != have:
            raise ValueError(f"verify covers tokens {start}..{start + n - 1}, not the last ones "
                             f"({self.kv.num_tokens} appended)")  # fmt: skip
        return VerifyRow(self, tokens, start, position)

    def attend_verify(self, layer: int, start: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """One layer of the dense pass over the n tokens from index `start`: writes their k/v
        (n, Hkv, Dh), dense values, into the fast tier and host copy and the metadata, and
        returns their causal attention over every page of every head (n, H*Dh)."""
        f = self.f
        self.kv.write_tokens(layer, start, k, v)
        self.meta.append_tokens(layer, k, start)
        parts = []
        window, g = self.windows[layer], self.group
        for h in range(f.config.num_kv_heads):
            keys, values = self.kv.full_kv(layer, h)
            qh = q[:, h * g : (h + 1) * g]
            if window is None:
                parts.append(last_tokens_attention(qh, keys, values, f.scale))
            else:  # the spec's windowed attention (the reference's masked path)
                kv = (keys[:, None], values[:, None])
                parts.append(attention(qh, *kv, None, f.scale, window))
        off = self.kv.offloaded_heads[layer]
        self._host_read += len(off) * self.kv.num_tokens * self.kv.page_bytes // self.page
        return torch.cat(parts, dim=1)

    @property
    def _bound_scale(self) -> float:
        """Score bounds -> attention logits: the `sum` combine adds G query heads' bounds."""
        return self.f.scale / (self.group if self.config.gqa_combine == "sum" else 1)

    def _offloaded_due(self) -> bool:
        due = (self.steps % self.interval) == 0
        return bool((due & self.kv.offload & ~self.streaming).any())

    def _slide(self) -> int:
        """Before a token is appended: the streaming heads' window moves to the pages there will
        be. Offloaded ones evict the pages that leave it (freeing the slot a page the token
        opens goes to) and promote pages that come back after a truncation. Returns head-pages
        promoted."""
        n_pages = self.kv.num_tokens // self.page + 1  # once the token is in
        start = max(1, n_pages - self.window)
        if start == self.window_start or not bool(self.streaming.any()):
            return 0
        self.window_start = start
        opened = -(-self.kv.num_tokens // self.page)
        window = torch.arange(start, max(start, opened))
        wanted = torch.cat([torch.zeros(1, dtype=torch.int64), window])
        return sum(
            self.kv.place(layer, heads, wanted.expand(len(heads), -1))
            for layer, heads in enumerate(self.window_offloaded)
            if len(heads)
        )

    def pages(self, layer: int) -> Tensor:
        """Logical pages each KV head attends at `layer` now: (Hkv, n), -1 padded."""
        n_pages = -(-self.kv.num_tokens // self.page)
        stream = self.streaming[layer]
        if (w := self.windows[layer]) is not None:  # the pages of the window's tokens
            first = max(0, self.kv.num_tokens - w) // self.page
            return torch.arange(first, n_pages).expand(len(stream), -1)
        window = torch.cat(
            [torch.zeros(1, dtype=torch.int64), torch.arange(self.window_start, n_pages)]
        )
        if bool(stream.all()):  # sink + window only
            return window.expand(len(stream), -1)
        ts = self.tail_start[layer]
        width = n_pages - int(ts[~stream].min())
        tail = ts[:, None] + torch.arange(max(width, 0))
        tail = tail.masked_fill(tail >= n_pages, -1)
        sink = torch.zeros(len(ts), 1, dtype=torch.int64)
        rows = torch.cat([sink, self.sel[layer], tail], dim=1)
        if not bool(stream.any()):
            return rows
        rows = torch.nn.functional.pad(rows, (0, max(0, len(window) - rows.shape[1])), value=-1)
        rows[stream] = -1
        rows[stream, : len(window)] = window
        return rows

    def _attend(self, layer: int, qg: Tensor) -> Tensor:
        if self.in_place and (slots := self._slots[layer]) is not None:
            return self._attend_slots(qg, *slots)
        pages, token, present = self._layer_pages(layer)
        k, v = self.kv.gather(layer, pages)  # (Hkv, n*page, Dh)
        valid = present & (token < self.kv.num_tokens)
        if (w := self.windows[layer]) is not None:  # the newest token sees the last w
            valid &= token >= self.kv.num_tokens - w
        return page_attention(qg, k, v, valid, self.f.scale)

    def _attend_slots(self, qg: Tensor, first: int, cap: int, host: Tensor) -> Tensor:
        """A layer whose heads are all offloaded, with `cap` slots each from arena row `first`:
        each head's slots hold exactly the pages it attends (`HeadPagedKV.place` keeps the
        wanted ones, pages opened since take free slots, a cut frees its pages' slots), so
        attention reads them in place, masked to the rows of held pages' written tokens. The
        same keys as `pages(layer)`'s gathered in another order: equal to fp32 rounding."""
        hkv, kv = len(host), self.kv
        k = kv.arena_k[first : first + hkv * cap].view(hkv, cap * self.page, -1)
        v = kv.arena_v[first : first + hkv * cap].view(hkv, cap * self.page, -1)
        held = kv.slot_page[host, :cap]  # (Hkv, cap) logical page, < 0 none
        token = held[:, :, None] * self.page + torch.arange(self.page)
        valid = ((held >= 0)[:, :, None] & (token < kv.num_tokens)).flatten(1)
        return page_attention(qg, k, v, valid, self.f.scale)

    def _layer_pages(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """`pages(layer)` (Hkv, n), the token index of each of their rows (Hkv, n*page) and
        whether the row's page is one, not padding (Hkv, n*page): what `pages` depends on is
        its key (pages opened, the streaming window, the layer's reranks, a sliding window's
        first page), and they are computed again only when it changes."""
        n = self.kv.num_tokens
        w = self.windows[layer]
        first = -1 if w is None else max(0, n - w) // self.page
        key = (-(-n // self.page), self.window_start, self._reranked[layer], first)
        cached = self._cached[layer]
        if cached is not None and cached[0] == key:
            return cached[1], cached[2], cached[3]
        pages = self.pages(layer)
        token = (pages[:, :, None] * self.page + torch.arange(self.page)).flatten(1)
        present = (pages >= 0).repeat_interleave(self.page, dim=1)
        self._cached[layer] = (key, pages, token, present)
        return pages, token, present

    def _rerank(self, layer: int, qg: Tensor) -> int:
        """Re-score the heads of `layer` due this step; returns head-pages promoted."""
        if self.windows[layer] is not None:  # a window: nothing to select
            return 0
        if all(self.steps % i for i in self._intervals[layer]):  # no head due
            return 0
        due = ((self.steps % self.interval[layer]) == 0) & ~self.streaming[layer]
        due = torch.nonzero(due).flatten()
        if len(due) == 0:
            return 0
        t0 = time.perf_counter()
        n_pages = -(-self.kv.num_tokens // self.page)
        tail_start = max(1, n_pages - self.recent)
        k = min(self.budget, tail_start - 1)
        sel = torch.full((len(due), self.budget), -1, dtype=torch.int64)
        if k > 0:
            scores = self.meta.scores(layer, qg, due, self.config.gqa_combine)  # (n, P)
            top = top_p_pages(scores[:, 1:tail_start], k, self.config.top_p, self._bound_scale)
            sel[:, :k] = torch.where(top >= 0, top + 1, -1).sort(dim=1).values
            self._selected += int((top >= 0).sum())
        self.sel[layer, due] = sel
        self.tail_start[layer, due] = tail_start
        self._reranked[layer] += 1
        promoted = 0
        off = due[self.kv.offload[layer, due]]
        if len(off):
            tail = torch.arange(tail_start, n_pages).expand(len(off), -1)
            sink = torch.zeros(len(off), 1, dtype=torch.int64)
            wanted = torch.cat([sink, sel[self.kv.offload[layer, due]], tail], dim=1)
            promoted = self.kv.place(layer, off, wanted)
        self._reranks += len(due)
        self._rerank_s += time.perf_counter() - t0
        return promoted


class VerifyRow(StepRow):
    """A `SparseDecoder`'s dense pass over the last n tokens, from token index `start`, as one
    row of n tokens (`SparseDecoder.attend_verify` per layer); the pass counted at `end`."""

    def __init__(self, decoder: SparseDecoder, tokens: list[int], start: int, position: int):
        super().__init__(tokens, list(range(position, position + len(tokens))))
        self.decoder, self.start, self.kind = decoder, start, "verify"

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.decoder.attend_verify(layer, self.start, q, k, v)

    def end(self) -> None:
        self.decoder._passes += 1


class SparseRow(StepRow):
    """A `SparseDecoder`'s step for token index `t`, begun: each layer's attention over the
    pages its heads select (`SparseDecoder.attend_layer`), the step counted at `end`."""

    def __init__(self, decoder: SparseDecoder, token: int, position: int, t: int) -> None:
        super().__init__(token, position)
        self.decoder, self.t, self.promoted, self.kind = decoder, t, 0, "sparse"

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        attn, promoted = self.decoder.attend_layer(layer, self.t, q, k, v)
        self.promoted += promoted
        return attn

    def end(self) -> None:
        self.decoder.end_step(self.promoted)
