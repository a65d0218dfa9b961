"""Staged prefill: vLLM computes every token that needs computing, the store supplies the rest.

The connector API lets a request take one contiguous run of tokens from outside vLLM, right
after vLLM's own prefix-cache hit; vLLM computes everything after it. A prompt whose reused
KV sits in several runs between tokens that must be computed is therefore sent as a chain of
requests, each one a longer prefix of the prompt, so that vLLM's prefix cache carries each
stage's KV into the next:

    prompt   [ system ][ update ......... ][ fixed A | fixed B ][ update ][last]
    computed            ^^^^^^^^^^^^^^^^^^^^^^^^ (boundary)      ^^^^^^^^^^^^^^^
    stage 1  [ hit | claim ][ vLLM computes ...... ]                              prompt [0, a2)
    stage 2  [ vLLM's prefix-cache hit: stage 1    ][ claim .... ][ vLLM ......... ] the prompt

Stage j claims the reused run [a_j, b_j) (the connector writes stored KV there, keys
re-rotated to their positions) and vLLM computes [b_j, a_{j+1}); the last stage runs to the
end of the prompt and generates. vLLM caches only whole blocks, so every run a later stage
claims starts on a block boundary: the tokens of a run before its first boundary are computed
instead (at most `block_size - 1` more per run), and a run too short to be worth a request of
its own (`min_claim_tokens`) is computed whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import torch

from agentcache.engines.vllm.storage import StoredMeta
from agentcache.errors import ConfigError
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse.runs import PlannedHit
from agentcache.reuse.segments import REUSABLE, reusable_tokens
from agentcache.reuse.selective import (
    ReusedRun,
    SelectiveRecompute,
    UpFrontSelection,
    reused_runs,
    select_up_front,
)
from agentcache.reuse.spec import StrategySpec
from agentcache.runtime.stats import TokenReuse


@dataclass(frozen=True)
class Stage:
    """One request of a staged prefill: the prompt's first `prompt_len` tokens, of which the
    connector fills `claim` (a reused run; vLLM's own hit may already cover its start) and
    vLLM computes the rest after its hit. `claim` None: vLLM computes all it lacks."""

    prompt_len: int
    claim: tuple[int, int] | None


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]
    computed: tuple[bool, ...]  # per prompt token: vLLM computes it (alignment included)
    requested: int = 0  # tokens the strategy computes (before alignment)
    # per prompt token: its stored KV was computed after this very context, at this position
    # (a claimed token that is not is re-rotated: `moved`); empty when not known
    exact: tuple[bool, ...] = ()

    def token_reuse(self, vllm_hit: int, computed_tokens: int) -> TokenReuse | None:
        """Where each prompt token's KV came from in a staged turn that ran this plan: vLLM's
        own prefix-cache hit of its first stage (`vllm_hit` tokens, exact) and the claimed
        runs are reused, the rest vLLM computed. None when that does not add up to the
        `computed_tokens` vLLM reported (a stage's claim declined at run time: vLLM computed
        a run the plan reused, and which one is not known here)."""
        n = len(self.computed)
        reused = ~torch.tensor(self.computed, dtype=torch.bool)
        reused[: max(0, vllm_hit)] = True
        if int(reused.sum()) != n - computed_tokens:
            return None
        exact = torch.zeros(n, dtype=torch.bool)
        if self.exact:
            exact = torch.tensor(self.exact, dtype=torch.bool)
        exact[: max(0, vllm_hit)] = True
        return TokenReuse.of(n, reused, exact, None)

    @property
    def num_computed(self) -> int:
        return sum(self.computed)

    @property
    def num_reused(self) -> int:
        return len(self.computed) - self.num_computed


def runs_to_claim(computed: Sequence[bool]) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of tokens not computed."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, c in enumerate([*computed, True]):
        if not c and start is None:
            start = i
        elif c and start is not None:
            runs.append((start, i))
            start = None
    return runs


def plan_stages(
    computed: Sequence[bool], block_size: int, min_claim_tokens: int | None = None
) -> StagePlan:
    """Stages for a prompt whose tokens vLLM must compute where `computed` is True (the last
    prompt token always is). A run starting at token 0 needs no alignment: its claim starts
    at vLLM's hit, whatever that is. `min_claim_tokens` defaults to one block."""
    if not computed or not computed[-1]:
        raise ValueError("the last prompt token must be computed (it gives the first output)")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    floor = block_size if min_claim_tokens is None else min_claim_tokens
    runs = []
    for start, end in runs_to_claim(computed):
        if start > 0:
            start = -(-start // block_size) * block_size
        if end - start >= max(1, floor):
            runs.append((start, end))
    mask = [True] * len(computed)
    for start, end in runs:
        mask[start:end] = [False] * (end - start)
    requested = sum(bool(c) for c in computed)
    stages = []
    if not runs or runs[0][0] > 0:
        stages.append(Stage(runs[0][0] if runs else len(computed), None))
    for j, run in enumerate(runs):
        prompt_len = runs[j + 1][0] if j + 1 < len(runs) else len(computed)
        stages.append(Stage(prompt_len, run))
    return StagePlan(tuple(stages), tuple(mask), requested)


def staged_strategy(spec: StrategySpec) -> SelectiveRecompute:
    """`spec`'s strategy, if a staged prefill can run it; otherwise a `ConfigError` saying
    which can."""
    built = spec.build()
    if not built.up_front:
        raise ConfigError(
            f"strategy {spec.label!r} cannot run as a staged prefill: the tokens it computes "
            "must be known before any layer runs (pic, epic, or rpdc with selection=offset); "
            "use fill='engine' or 'auto' for it"
        )
    return cast(SelectiveRecompute, built)  # only selective strategies select up front


def select_from_store(
    prompt: TokenizedPrompt,
    strategy: SelectiveRecompute,
    meta: Callable[[TokenizedSegment], StoredMeta | None],
) -> tuple[UpFrontSelection, list[ReusedRun]]:
    """What `strategy` decides before any layer runs, from the store's metadata (`meta` of a
    segment; None when it is not stored), and its reused runs with exactness read as vLLM's
    prefix cache sees it (stored after this very context, at these positions)."""
    hits = []
    for seg in prompt.segments:
        if seg.kind not in REUSABLE:
            continue
        found = meta(seg)
        n = reusable_tokens(prompt, seg)
        if found is not None and n > 0:
            hits.append(PlannedHit(seg, n, found.context_id, found.positions))
    natural = torch.arange(prompt.num_tokens)
    o = strategy.options
    selection = select_up_front(o, prompt.num_tokens, reused_runs(prompt, hits, natural, o))
    return selection, reused_runs(prompt, hits, natural, replace(o, exact_prefix=True))


def plan_prompt(
    prompt: TokenizedPrompt,
    strategy: SelectiveRecompute,
    meta: Callable[[TokenizedSegment], StoredMeta | None],
    block_size: int,
    min_claim_tokens: int | None = None,
) -> StagePlan:
    """The stages for `prompt` under an up-front strategy (`ReuseStrategy.up_front`):
    the tokens it computes up front are what vLLM computes, alignment added."""
    if not strategy.up_front:
        raise ConfigError(f"strategy {strategy.name!r} cannot run as a staged prefill")
    selection, runs = select_from_store(prompt, strategy, meta)
    plan = plan_stages(selection.base.tolist(), block_size, min_claim_tokens)
    exact = [False] * prompt.num_tokens
    for r in runs:
        if r.exact:
            exact[r.start : r.end] = [True] * r.num_tokens
    return replace(plan, exact=tuple(exact))


def exact_prefix_plan(num_tokens: int, hit: int, block_size: int) -> StagePlan:
    """vLLM computes every token after the stored exact prefix [0, `hit`), which the turn's
    request claims: where vLLM's own prefix cache still holds it the claim is empty, and
    where vLLM evicted it (memory pressure) the connector loads it from the store, vLLM's
    own KV stored after this very context, instead of vLLM computing it again."""
    hit = max(0, min(hit, num_tokens - 1))  # the last prompt token is always computed
    plan = plan_stages([False] * hit + [True] * (num_tokens - hit), block_size)
    return replace(plan, exact=tuple(not c for c in plan.computed))


def exact_prefix_tokens(runs: list[ReusedRun], block_size: int) -> int:
    """About what vLLM's own prefix cache holds of a prompt: the leading stored segments
    computed after this very context, in whole blocks."""
    end = 0
    for r in runs:
        if r.start != end or not r.exact:
            break
        end = r.end
    return end // block_size * block_size


def engine_tokens(selection: UpFrontSelection) -> int:
    """The tokens the engine computes through every layer: its base and its budget."""
    ranked = min(selection.budget, int((selection.candidates & ~selection.base).sum()))
    return int(selection.base.sum()) + ranked


FILLS = ("vllm", "engine")


@dataclass
class FillChooser:
    """Who computes what reuse cannot supply (`fill="auto"`): vLLM (a staged prefill for a
    positional strategy; for the others, vLLM computing everything after the stored exact
    prefix, `exact_prefix_plan`) or agentcache's engine inside the worker. Which is faster depends
    on the machine (vLLM's kernels against agentcache's forward; a GPU; load), so it is
    measured: the turn's TTFT per computed token, averaged over turns (the newest weighs
    `weight`). Each fill is tried `warmup` times first, in turn; then the one predicted
    cheaper runs, and the other once every `revisit` turns, so a change is noticed."""

    warmup: int = 2
    revisit: int = 16
    weight: float = 0.3
    cost_ms: dict[str, float] = field(default_factory=dict)  # fill -> ms per computed token
    samples: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FILLS, 0))
    turns: int = 0

    def choose(self, vllm_tokens: int, engine_tokens: int) -> str:
        """The fill for a turn where vLLM would compute `vllm_tokens` and the engine about
        `engine_tokens`."""
        self.turns += 1
        fewest = min(FILLS, key=lambda f: self.samples[f])
        if self.samples[fewest] < self.warmup:
            return fewest
        predicted = {"vllm": self.cost_ms["vllm"] * vllm_tokens}
        predicted["engine"] = self.cost_ms["engine"] * engine_tokens
        best = min(FILLS, key=lambda f: predicted[f])
        if self.turns % self.revisit == 0:
            return next(f for f in FILLS if f != best)
        return best

    def observe(self, fill: str, ttft_ms: float, computed_tokens: int) -> None:
        per_token = ttft_ms / max(1, computed_tokens)
        old = self.cost_ms.get(fill)
        self.cost_ms[fill] = per_token if old is None else old + self.weight * (per_token - old)
        self.samples[fill] += 1
