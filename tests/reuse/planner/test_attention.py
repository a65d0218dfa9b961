"""The planner's model-read signals: the fresh pass's attention read against a plain
reference, which tokens each plan leaves out against its `PlanSignals`, and the offline reads
of a session's turns."""

from __future__ import annotations

import pytest
import torch

from agentcache.bench.reuse.planner.data import tokenize
from agentcache.bench.reuse.planner.reads import session_deviations, session_masses
from agentcache.kv.store import segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.reuse.guard import CostModel
from agentcache.reuse.planner.attention import read_attention
from agentcache.reuse.planner.candidates import CANDIDATES, LeftOut, left_out, plan_signals
from agentcache.reuse.planner.history import PlanHistory
from agentcache.reuse.ranking.probs import attention_probs_reference
from agentcache.workload.files import Session, Turn
from tests.reuse.test_contract import agent_prompt


def _reference(tiny: LoadedModel, ids: torch.Tensor, layers: int, window: int) -> torch.Tensor:
    """(layers, T) the window's head- and query-mean attention, from the dense forward's
    layers run one by one and softmax written plainly."""
    f = tiny.forward
    positions = torch.arange(len(ids))
    hidden, out = f.embed(ids), []
    for layer in range(layers):
        q, k, v = f.project(layer, hidden, positions)
        w = positions[-window:]
        probs = attention_probs_reference(q[w], w, k, f.scale)  # (H, W, T)
        out.append(probs.mean(dim=(0, 1)))
        hidden = f.attend(layer, hidden, q, k, v, None)
    return torch.stack(out)


def test_the_read_is_the_attention_the_last_tokens_pay(tiny: LoadedModel) -> None:
    ids = torch.tensor(tiny.tokenizer.encode("the planner reads where the end looks " * 4))
    read = read_attention(tiny.forward, ids, 2, 8)
    assert read.mass.shape == read.peak.shape == (2, len(ids))
    torch.testing.assert_close(read.mass, _reference(tiny, ids, 2, 8), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(read.mass.sum(dim=1), torch.ones(2))
    assert bool((read.peak >= read.mass - 1e-7).all())  # a max over the window's queries
    one = read_attention(tiny.forward, ids, 1, 8)  # layer 0 needs no layer run before it
    torch.testing.assert_close(one.mass[0], read.mass[0])
    left = torch.zeros(len(ids), dtype=torch.bool)
    left[3:9] = True
    assert read.left_mass(left, 1) == pytest.approx(float(read.mass[1, 3:9].sum()))
    with pytest.raises(ValueError, match="layers and window"):
        read_attention(tiny.forward, ids, 0, 8)


def test_a_probe_leaves_the_pool_tokens_it_ranks_lowest() -> None:
    surely = torch.tensor([1, 0, 0, 0, 0, 0], dtype=torch.bool)
    ranked = torch.tensor([0, 1, 1, 1, 1, 0], dtype=torch.bool)
    scores = torch.tensor([0.0, 0.1, 0.4, 0.2, 0.4, 9.0])
    left = LeftOut(surely, ranked, 2).given(scores)
    # picks 2 and 4 (0.4 each); leaves 1 and 3, and 0 whatever it ranks
    assert left.nonzero().flatten().tolist() == [0, 1, 3]
    assert LeftOut(surely, ranked, 4).given(scores).nonzero().flatten().tolist() == [0]


def test_left_out_positions_agree_with_each_plans_count(tiny: LoadedModel) -> None:
    history, held, approximate = PlanHistory(), set[str](), 0
    strategies = {n: c.build() for n, c in CANDIDATES.items()}
    for update in ("memory v1", "memory v2, now much longer: " * 6, "v3"):
        prompt = tokenize(tiny, agent_prompt(update))
        hits = list(history.hits(prompt, held.__contains__))
        scores = torch.rand(prompt.num_tokens, generator=torch.Generator().manual_seed(0))
        for n, c in CANDIDATES.items():
            s = plan_signals(c, strategies[n], prompt, hits, 0, CostModel.of(tiny.config))
            left = left_out(c, strategies[n], prompt, hits).given(scores)
            assert int(left.sum()) == s.left, n
            approximate += not s.exact
        history.record(prompt, torch.arange(prompt.num_tokens))
        held.update(segment_content_id(s.ids, s.segment.scope) for s in prompt.segments)
    assert approximate > 0  # some plan left tokens out


def test_the_offline_reads_see_what_each_plan_leaves_out(tiny: LoadedModel) -> None:
    turns = tuple(Turn(agent_prompt(u), 4) for u in ("memory v1", "memory v1", "memory v2 " * 5))
    session = Session("s-00", "w", "", turns, "tune")
    with torch.inference_mode():
        masses = session_masses(tiny, session, 2, 8)
        devs = session_deviations(tiny, session, 2, 8)
    assert masses[0] == devs[0] == {}  # cold: no read
    # nothing changed: every plan is exact, nothing left out
    assert all(v == [0.0, 0.0] for v in masses[1].values())
    assert all(v == [0.0, 0.0] for v in devs[1].values())
    # the memory changed: pic leaves out the history after it, epic only what lies past its
    # chunks' first tokens (a subset); exact plans leave nothing
    pic, epic = masses[2]["pic"], masses[2]["epic"]
    assert all(0.0 < p <= 1.0 for p in pic)
    assert all(e <= p for e, p in zip(epic, pic, strict=True))
    assert masses[2]["exact"] == masses[2]["full"] == [0.0, 0.0]
    # layer 0's keys see no context: the stored copy's equal the fresh ones there
    assert devs[2]["pic"][0] == pytest.approx(0.0, abs=1e-9)
    assert devs[2]["pic"][1] > 1e-6
