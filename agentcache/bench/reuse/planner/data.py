"""Planner tuning data: stored bench runs' per-turn measurements of fixed strategies, joined
with the `PlanSignals` each plan would have had on that turn.

The signals come from replaying a session's store metadata (what every turn commits: its
segments' positions and contexts, and prefix blocks) over the tokenized turns: no model
call, the same functions the planner runs (`PlanHistory`, `plan_signals`). A run's record
whose prompt length differs from the replay's (the workload changed since) is dropped, and
counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentcache.kv.store import segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt.tokenize import TokenizedPrompt, tokenize_prompt
from agentcache.reuse.guard import CostModel
from agentcache.reuse.planner.candidates import CANDIDATES, PlanSignals, plan_signals
from agentcache.reuse.planner.history import PlanHistory
from agentcache.reuse.prefix import block_chain, chain_scope
from agentcache.reuse.runs import StoredHit
from agentcache.reuse.segments import HeadIndex, context_ids, scoped
from agentcache.workload.files import Session, load_workload

PAGE = 16  # the engine's default page size, as the stored runs used


@dataclass(frozen=True)
class PlanRow:
    family: str
    session: str
    turn: int
    plan: str
    signals: PlanSignals
    record: dict[str, Any]  # the bench record: ttft_ms, ttft_full_ms, kl_first_token, tf_kl...
    on_turn: dict[str, PlanSignals] = field(default_factory=dict)  # every plan's, this turn


def session_signals(model: LoadedModel, session: Session) -> list[dict[str, PlanSignals]]:
    """Per turn, every plan's signals, replaying what the planner's commits would store."""
    strategies = {n: c.build() for n, c in CANDIDATES.items()}
    costs = CostModel.of(model.config)
    return [{n: plan_signals(c, strategies[n], t.prompt, t.hits, t.prefix, costs)
             for n, c in CANDIDATES.items()} for t in replay(model, session)]  # fmt: skip


@dataclass(frozen=True)
class ReplayedTurn:
    prompt: TokenizedPrompt
    hits: list[StoredHit]  # the stored segments the planner would see
    prefix: int  # the tokens `prefix` would reuse


def replay(model: LoadedModel, session: Session) -> Iterator[ReplayedTurn]:
    """Each turn as the planner would see it, every earlier turn committed at its natural
    positions (what the planner's commits store), with the heads the engine's strategies
    find (`update_heads`, on by default)."""
    history, held, blocks, heads = PlanHistory(), set[str](), set[str](), HeadIndex()
    for turn in session.turns:
        prompt = tokenize(model, turn.prompt)
        hits: list[StoredHit] = list(history.hits(prompt, held.__contains__, heads, True))
        prefix = 0
        for cid in block_chain(prompt.ids, PAGE, chain_scope(prompt)):
            if cid not in blocks:
                break
            prefix += PAGE
        yield ReplayedTurn(prompt, hits, max(0, min(prefix, prompt.num_tokens - 1)))
        history.record(prompt, torch.arange(prompt.num_tokens))
        for seg, context in zip(prompt.segments, context_ids(prompt), strict=True):
            cid = segment_content_id(seg.ids, seg.segment.scope)
            if cid not in held:  # stored now, computed after this very context
                heads.add(scoped("segment", seg), context, cid, seg.ids)
                held.add(cid)
        blocks.update(block_chain(prompt.ids, PAGE, chain_scope(prompt)))


def tokenize(model: LoadedModel, prompt: Any) -> TokenizedPrompt:
    c = model.config.max_position_embeddings
    return tokenize_prompt(prompt, model.tokenizer, model.chat_format, c)


def rows_from_runs(
    model: LoadedModel, runs: list[tuple[Path, dict[str, str]]], workloads: list[Path],
    split: str,
) -> tuple[list[PlanRow], int]:  # fmt: skip
    """Rows of the `split` sessions' warm turns in each run folder (labels mapped to plans by
    the run's dict), and the count of records dropped for a prompt length mismatch."""
    sessions = {s.name: s for w in workloads for s in load_workload(w).sessions}
    cache: dict[str, list[dict[str, PlanSignals]]] = {}
    rows, dropped = [], 0
    for folder, labels in runs:
        for r in json.loads((folder / "results.json").read_text())["turns"]:
            s = sessions.get(r["session"])
            if s is None or s.split != split or r["turn"] == 0 or r["strategy"] not in labels:
                continue
            if s.name not in cache:
                cache[s.name] = session_signals(model, s)
            turn = cache[s.name][r["turn"]]
            sig = turn[labels[r["strategy"]]]
            if sig.prompt_tokens != r["prompt_tokens"]:
                dropped += 1
                continue
            rows.append(PlanRow(s.workload, s.name, r["turn"], sig.plan, sig, r, turn))
    return rows, dropped
