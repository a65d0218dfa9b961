"""The model-read signal (`planner/attention.py`) on stored tuning and validation turns: per
turn, one fresh pass through the first layers; per plan, the attention mass the window pays
the changed tokens the plan leaves out, at each layer read.

A probe plan's left-out tokens depend on its probe's ranking; here the pool is ranked by the
read's own `peak` summed over layers 1.. (layer 0 when only it is read), rpdc's probe score
over fresh KV instead of the cached KV its probe reads.

Per session, the values are cached as JSON (`cache_dir/<session>.json`), so a rerun reads
them instead of the model.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from agentcache.bench.reuse.planner.data import PlanRow, replay
from agentcache.kv.store import segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.reuse.planner.attention import AttentionRead, read_attention
from agentcache.reuse.planner.candidates import CANDIDATES, left_out
from agentcache.workload.files import Session

# per turn: plan -> [mass at layer 0, 1, ...] on the tokens it leaves out
TurnMasses = dict[str, list[float]]


def rank_scores(read: AttentionRead) -> Tensor:
    """(T,) the score a probe plan's pool is ranked by."""
    return read.peak[1:].sum(dim=0) if read.peak.shape[0] > 1 else read.peak[0]


def session_masses(model: LoadedModel, session: Session, layers: int,
                   window: int) -> list[TurnMasses]:  # fmt: skip
    strategies = {n: c.build() for n, c in CANDIDATES.items()}
    out: list[TurnMasses] = []
    for t in replay(model, session):
        if not t.hits:  # nothing a plan could leave out (a cold turn): no read
            out.append({})
            continue
        read = read_attention(model.forward, torch.tensor(t.prompt.ids), layers, window)
        scores = rank_scores(read)
        turn: TurnMasses = {}
        for n, c in CANDIDATES.items():
            left = left_out(c, strategies[n], t.prompt, t.hits).given(scores)
            turn[n] = [read.left_mass(left, layer) for layer in range(layers)]
        out.append(turn)
    return out


def cached_masses(model: LoadedModel, session: Session, layers: int, window: int,
                  cache_dir: Path, deviation: bool = False) -> list[TurnMasses]:  # fmt: skip
    """`session_masses` (`session_deviations` with `deviation`), read from `cache_dir` when
    cached there, else computed and cached."""
    path = cache_dir / f"{session.name}.json"
    if path.exists():
        return list(json.loads(path.read_text()))
    read = session_deviations if deviation else session_masses
    masses = read(model, session, layers, window)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(masses))
    return masses


def session_deviations(model: LoadedModel, session: Session, layers: int,
                       window: int) -> list[TurnMasses]:  # fmt: skip
    """Per warm turn and plan, at each layer 1..`layers`-1: the attention-weighted key
    deviation of the tokens it leaves out, sum_i mass_i * ||k_i - k_i(stored)||^2 /
    ||k_i||^2, the stored copy's keys being those of the turn that first stored the
    segment (keys before RoPE: re-rotation moves both alike)."""
    strategies = {n: c.build() for n, c in CANDIDATES.items()}
    stored: dict[str, Tensor] = {}  # content id -> (P, n, Hkv, Dh) keys of the first copy
    out: list[TurnMasses] = []
    for t in replay(model, session):
        read = read_attention(model.forward, torch.tensor(t.prompt.ids), layers, window, True)
        assert read.keys is not None
        turn: TurnMasses = {}
        if t.hits:
            dev = torch.zeros(layers, t.prompt.num_tokens)
            for h in t.hits:
                old = stored.get(segment_content_id(h.segment.ids, h.segment.segment.scope))
                if old is None:  # a head: another segment's opening, exact here
                    continue
                new = read.keys[:, h.start : h.start + h.num_tokens]
                diff = (new - old[:, : h.num_tokens]).pow(2).sum(dim=(2, 3))
                dev[:, h.start : h.start + h.num_tokens] = diff / new.pow(2).sum(dim=(2, 3))
            scores = rank_scores(read)
            for n, c in CANDIDATES.items():
                left = left_out(c, strategies[n], t.prompt, t.hits).given(scores)
                turn[n] = [float((read.mass[x] * dev[x])[left].sum()) for x in range(layers)]
        out.append(turn)
        for seg in t.prompt.segments:
            cid = segment_content_id(seg.ids, seg.segment.scope)
            if cid not in stored:
                stored[cid] = read.keys[:, seg.start : seg.end].clone()
    return out


def with_read(rows: list[PlanRow], reads: dict[str, list[TurnMasses]], layer: int,
              field: str = "attn") -> list[PlanRow]:  # fmt: skip
    """`rows` with `signals.<field>` ("attn" or "dev") set to the read at `layer` (0 on an
    exact plan-turn)."""
    out = []
    for r in rows:
        value = reads[r.session][r.turn][r.plan][layer] if not r.signals.exact else 0.0
        s = replace(r.signals, dev=value) if field == "dev" else replace(r.signals, attn=value)
        out.append(replace(r, signals=s))
    return out
