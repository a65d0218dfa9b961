"""bench-decode stops with a clear error naming the problem before any decode step, and
prepares a missing head profile itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentcache.cli import main
from agentcache.decode.profile import profile_filename
from agentcache.model.loading import LoadedModel
from tests.decode.conftest import TEXT, make_profile

ARGS = ["--context", "600", "--new-tokens", "8", "--budget", "4", "--threads", "1"]
Edit = Callable[[dict[str, Any]], None]


def _set(key: str, value: Any) -> Edit:
    return lambda raw: raw.__setitem__(key, value)


def _stability(layer: int, head: int, value: Any) -> Edit:
    return lambda raw: raw["stability"][layer].__setitem__(head, value)


PROFILES: list[tuple[str, Edit | str, str]] = [
    ("another model", _set("model_id", "other-model#abc"), "is for model other-model#abc, not "),
    ("not JSON", "{not json", "is corrupted: not JSON"),
    ("not an object", "[1, 2]", "is corrupted: not a JSON object but a list"),
    ("other format", _set("format", "x/2"), "not an agentcache-head-profile/1 file"),
    ("missing keys", lambda raw: [raw.pop("unstable"), raw.pop("stability")],
     "missing key(s) stability, unstable"),
    ("non-numeric stability", _stability(1, 0, "high"), "stability[1][0] = 'high' is not a "
     "number in [0, 1]"),
    ("NaN stability", _stability(2, 1, float("nan")), "stability[2][1] = nan is not a number"),
    ("boolean stability", _stability(0, 0, True), "stability[0][0] = True is not a number"),
    ("out-of-range stability", _stability(3, 1, 1.5), "stability[3][1] = 1.5 is not a number"),
    ("stability rows", lambda raw: raw["stability"].pop(), "stability is not 4 rows of 2 scores"),
    ("stability not a list", _set("stability", 0.5), "stability is not 4 rows of 2 scores"),
    ("declared shape", _set("num_layers", 3), "its shape is 3 x 2, the model's 4 layers x 2"),
    ("head out of range", _set("unstable", [[0, 2]]), "unstable head [0, 2] is out of range for "
     "4 layers x 2 KV heads"),
    ("layer out of range", _set("unstable", [[4, 0]]), "unstable head [4, 0] is out of range"),
    ("negative head", _set("unstable", [[1, -1]]), "unstable head [1, -1] is out of range"),
    ("head not an integer", _set("unstable", [["a", 1]]), "unstable entry ['a', 1] is not a "
     "(layer, KV head) pair of integers"),
    ("head not a pair", _set("unstable", [[1]]), "unstable entry [1] is not a (layer, KV head)"),
    ("unstable not a list", _set("unstable", 3), "unstable is a int, not a list"),
    ("unknown key", _set("colour", "red"), "unexpected content"),
]  # fmt: skip


@pytest.fixture
def bench(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., tuple[int, str]]:
    """Runs bench-decode on the tiny model; a decode step fails the test."""
    import agentcache.bench.decode.bench as bench_module
    import agentcache.model.loading as loading

    def no_decode(*_: object, **__: object) -> None:
        raise AssertionError("decoding started")

    monkeypatch.setattr(loading, "load_model", lambda *_: tiny)
    monkeypatch.setattr(bench_module, "run_decode_bench", no_decode)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(TEXT)

    def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
        out = ["--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
        code = main(["bench-decode", str(prompts), *ARGS, *out, *argv])
        return code, capsys.readouterr().err

    return run


@pytest.mark.parametrize(
    ("edit", "needle"), [p[1:] for p in PROFILES], ids=[p[0] for p in PROFILES]
)
def test_a_bad_profile_is_named_before_decoding(
    edit: Edit | str, needle: str, tiny: LoadedModel, tmp_path: Path,
    bench: Callable[..., tuple[int, str]], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    path = tmp_path / "profile.json"
    raw = json.loads(make_profile(tiny).to_json())
    if isinstance(edit, str):
        path.write_text(edit)
    else:
        edit(raw)
        path.write_text(json.dumps(raw))
    code, err = bench(capsys, "--policies", "dense,flexicache", "--profile", str(path))
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"agentcache: error: head profile {path} ") and needle in err


@pytest.mark.parametrize(
    ("policies", "needle"),
    [
        ("dense,quest:budget=36", "quest:budget=36: a budget of 36 pages exceeds the 35 pages it "
         "can rank at a 600-token context (38 pages less the sink and 2 recent)"),
        ("dense,flexicache:recent=4:budget=34", "a budget of 34 pages exceeds the 33 pages"),
        ("dense,flexicache:speed=2", "decode policy option 'speed=2' in 'flexicache:speed=2': "
         "use key=value, keys: verify, budget, recent, top_p"),
        ("dense,flexicache:verify=x", "option 'verify=x' in 'flexicache:verify=x': not an integer"),
        ("dense,flexicache:verify=-1", "verify must be >= 0"),
        ("dense,flexicache:budget=0", "budget_pages must be >= 1"),
        ("dense,sparse", "unknown decode policy 'sparse'"),
        ("dense,streaming:window=0", "streaming option window must be >= 1 page, got 0"),
        ("dense,streaming:window=-2", "streaming option window must be >= 1 page, got -2"),
        ("dense,streaming:fraction=1.5", "streaming option fraction (of the stable heads) "
         "must be in [0, 1], got 1.5"),
        ("dense,streaming:fraction=-0.1", "fraction (of the stable heads) must be in [0, 1]"),
        ("dense,streaming:fraction=nan", "fraction (of the stable heads) must be in [0, 1]"),
        ("dense,streaming:window=x", "option 'window=x' in 'streaming:window=x': not an integer"),
        ("dense,streaming:sink=2", "decode policy option 'sink=2' in 'streaming:sink=2': use "
         "key=value, keys: verify, budget, recent, top_p, fraction, window"),
        ("dense,flexicache:window=4", "option 'window=4' in 'flexicache:window=4': use key=value, "
         "keys: verify, budget, recent, top_p"),
        ("dense,quest:interval=0", "quest option interval must be >= 1 step, got 0"),
        ("dense,quest:interval=x", "option 'interval=x' in 'quest:interval=x': not an integer"),
        ("flexicache", "the policies must include dense"),
    ],
)  # fmt: skip
def test_a_bad_policy_or_budget_is_named_before_decoding(
    policies: str, needle: str, bench: Callable[..., tuple[int, str]],
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import agentcache.model.loading as loading
    from tests.conftest import no_model

    monkeypatch.setattr(loading, "load_model", no_model)  # found before the model loads
    code, err = bench(capsys, "--policies", policies)
    assert code == 2 and err.startswith("agentcache: error: ") and needle in err


def test_a_budget_larger_than_the_context_is_an_error(
    bench: Callable[..., tuple[int, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = bench(capsys, "--policies", "dense,quest", "--budget", "40")
    assert code == 2 and "a budget of 40 pages exceeds the 35 pages" in err
    assert "lower --budget to at most 35" in err


def test_a_missing_profile_is_made_first_and_said_so(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *_: tiny)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(TEXT)
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = [*ARGS, "--policies", "dense,flexicache", "--no-teacher-forced"]
    code = main(["bench-decode", str(prompts), *argv, "--out", str(out), "--cache-dir", str(cache)])
    err = capsys.readouterr().err
    profile = cache / "profiles" / profile_filename(tiny.model_id)
    assert code == 0, err
    assert f"no head profile for model {tiny.model_id} at {profile}: profiling its heads" in err
    assert profile.is_file() and profile.with_suffix(".png").is_file()
    assert "flexicache" in json.loads((out / "results.json").read_text())["policies"]


@pytest.mark.parametrize("name", ["dense_fallback", "short_dense"])
def test_a_switch_that_is_not_a_bool_is_named(name: str) -> None:
    from agentcache.decode.config import DecodeConfig

    with pytest.raises(ValueError, match=f"^{name} must be True or False, got 'false'$"):
        DecodeConfig("flexicache", **{name: "false"})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["profile", "profile_dir"])
def test_a_profile_path_may_be_a_str_and_must_be_a_path(name: str, tmp_path: Path) -> None:
    from agentcache.decode.config import DecodeConfig

    config = DecodeConfig("flexicache", **{name: str(tmp_path / "p.json")})
    assert getattr(config, name) == tmp_path / "p.json"
    assert isinstance(getattr(config, name), Path)
    with pytest.raises(ValueError, match=f"^{name} must be a path, got 3$"):
        DecodeConfig("flexicache", **{name: 3})
