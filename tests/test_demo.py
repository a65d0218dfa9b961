from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentcache import demo
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, GenerationParams


def test_every_engine_runs_first_on_some_turn() -> None:
    names = ["full", "prefix", "rpdc"]
    orders = [demo.turn_order(names, t) for t in range(3)]
    assert [o[0] for o in orders] == names
    assert all(sorted(o) == sorted(names) for o in orders)
    assert demo.turn_order(names, 4) == orders[1]


def test_demo_warms_up_untimed_then_rotates_engines(
    tiny: LoadedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(demo, "load_model", lambda model, cache_dir: tiny)
    calls: list[tuple[int, bool]] = []  # (engine id, committed)
    generate = Engine.generate

    def spy(self: Engine, prompt, params=None, strategy=None, commit=True, **kw):  # type: ignore[no-untyped-def]
        calls.append((id(self), commit))
        return generate(self, prompt, params, strategy, commit, **kw)

    monkeypatch.setattr(Engine, "generate", spy)
    assert demo.run_demo(None, tmp_path, ["prefix", "rpdc"], turns=3, tokens=2) == 0
    assert "agentcache demo on tiny-llama" in capsys.readouterr().out
    warm, turns = calls[0], calls[1:]
    assert warm[1] is False and all(committed for _, committed in turns)
    assert len(turns) == 3 * 3
    firsts = [turns[3 * t][0] for t in range(3)]
    assert len(set(firsts)) == 3  # a different engine opens each turn
    assert warm[0] == turns[0][0]  # the warm-up ran on the engine that opens turn 1: full


def test_kept_column_counts_the_kv_used_not_the_found_tokens_recomputed(tiny: LoadedModel) -> None:
    engine = Engine(tiny)
    prompt = demo.build_prompt(0, [], demo.USER_TURNS[0])
    s = engine.generate(prompt, GenerationParams(max_new_tokens=1)).stats
    assert demo.kept_cell(s) == "0%"  # nothing stored yet: all computed
    found = dataclasses.replace(
        s, reused_tokens=60, exact_tokens=30, moved_tokens=10, refreshed_tokens=20,
        computed_tokens=s.prompt_tokens - 60,
    )  # fmt: skip
    assert demo.kept_cell(found) == f"{40 / s.prompt_tokens:.0%} +20"
    exact = dataclasses.replace(found, moved_tokens=30, refreshed_tokens=0)
    assert demo.kept_cell(exact) == f"{60 / s.prompt_tokens:.0%}"
