"""Client data the connector refuses: every malformed `kv_transfer_params` is a `PromptError`
naming the field, never another exception (no vLLM)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentcache.engines.vllm.request import RequestSpec, SegmentSpan, sign_scopes
from agentcache.errors import PromptError
from agentcache.prompt.segments import SegmentKind

N = 64
OK_SPANS: list[list[Any]] = [
    ["system", 0, 10, "sys"],
    ["fixed", 10, 60, "h"],
    ["update", 60, 64, "q"],
]


def body(**fields: Any) -> dict[str, Any]:
    return {"agentcache": {"segments": OK_SPANS, **fields}}


def spans(*items: Any) -> dict[str, Any]:
    return {"agentcache": {"segments": list(items)}}


BAD: list[tuple[str, Any, str]] = [
    ("params-list", [1, 2], "kv_transfer_params must be an object"),
    ("params-str", "agentcache", "kv_transfer_params must be an object"),
    ("params-int", 7, "kv_transfer_params must be an object"),
    ("body-list", {"agentcache": [1]}, "agentcache must be an object"),
    ("body-str", {"agentcache": "x"}, "agentcache must be an object"),
    ("body-int", {"agentcache": 5}, "agentcache must be an object"),
    ("body-zero", {"agentcache": 0}, "agentcache must be an object"),
    ("body-empty-list", {"agentcache": []}, "agentcache must be an object"),
    ("body-empty-str", {"agentcache": ""}, "agentcache must be an object"),
    ("unknown-field", body(evil=1), r"unknown kv_transfer_params fields \['evil'\]"),
    ("client-scope-field", body(scope="conv-1"), r"fields \['scope'\]"),
    ("segments-dict", {"agentcache": {"segments": {"a": 1}}}, "segments must be a list"),
    ("segments-str", {"agentcache": {"segments": "0-64"}}, "segments must be a list"),
    ("segments-int", {"agentcache": {"segments": 3}}, "segments must be a list"),
    ("span-dict", spans({"kind": "fixed"}), "is not \\[kind, start, end, id, scope\\]"),
    ("span-str", spans("fixed 0 64"), "is not \\[kind"),
    ("span-3", spans(["fixed", 0, 64]), "is not \\[kind"),
    ("span-6", spans(["fixed", 0, 64, None, None, None]), "is not \\[kind"),
    ("kind-int", spans([3, 0, 64, None]), "segment kind must be a string"),
    ("kind-none", spans([None, 0, 64, None]), "segment kind must be a string"),
    ("kind-unknown", spans(["memory", 0, 64, None]), "unknown segment kind"),
    ("start-float", spans(["fixed", 0.0, 64, None]), "span ends must be integers"),
    ("end-float", spans(["fixed", 0, 63.5, None]), "span ends must be integers"),
    ("start-str", spans(["fixed", "0", 64, None]), "span ends must be integers"),
    ("end-bool", spans(["fixed", 0, True, None]), "span ends must be integers"),
    ("start-none", spans(["fixed", None, 64, None]), "span ends must be integers"),
    ("start-negative", spans(["fixed", -1, 64, None]), "tile the prompt"),
    ("empty-span", spans(["fixed", 0, 0, None]), "tile the prompt"),
    ("gap", spans(["fixed", 0, 10, None], ["fixed", 12, 64, None]), "tile the prompt"),
    ("overlap", spans(["fixed", 0, 10, None], ["fixed", 8, 64, None]), "tile the prompt"),
    ("short-cover", spans(["fixed", 0, 10, None]), "cover 10 tokens"),
    ("long-cover", spans(["fixed", 0, 65, None]), "cover 65 tokens"),
    ("huge-end", spans(["fixed", 0, 10**30, None]), "the prompt has 64"),
    ("no-spans-empty-list", {"agentcache": {"segments": [], "stage": [0, 0]}}, "stage needs"),
    ("too-many-spans", spans(*[["fixed", i, i + 1, None] for i in range(65)]), "65 segment"),
    ("id-int", spans(["fixed", 0, 64, 5]), "segment id must be a string"),
    ("id-long", spans(["fixed", 0, 64, "x" * 300]), "segment id must be a string of 1-256"),
    ("id-empty", spans(["fixed", 0, 64, ""]), "segment id must be a string"),
    ("id-list", spans(["fixed", 0, 64, ["h"]]), "segment id must be a string"),
    ("scope-int", spans(["fixed", 0, 64, "h", 9]), "segment scope must be a string"),
    ("scope-long", spans(["fixed", 0, 64, "h", "s" * 257]), "segment scope must be a string"),
    ("scope-unsigned", spans(["fixed", 0, 64, "h", "conv-1"]), "scopes are not signed"),
    ("sig-no-scope", body(scope_sig="00"), "scope_sig given for spans without scopes"),
    ("strategy-int", body(strategy=3), "strategy must be a string"),
    ("strategy-empty", body(strategy=""), "strategy must be a string"),
    ("strategy-long", body(strategy="pic:" + "x" * 300), "strategy must be a string of 1-256"),
    ("strategy-list", body(strategy=["pic"]), "strategy must be a string"),
    ("strategy-unknown", body(strategy="evil"), "unknown reuse strategy 'evil'"),
    ("strategy-pair", body(strategy="pic:x"), "is not key=value"),
    ("strategy-option", body(strategy="pic:foo=1"), r"unknown options \['foo'\]"),
    ("strategy-value", body(strategy="rpdc:ratio=abc"), "ratio must be a number"),
    ("report-path", body(report="../../etc/x"), "report name must be alphanumeric"),
    ("report-int", body(report=12), "report name must be alphanumeric"),
    ("report-long", body(report="a" * 65), "report name must be alphanumeric, 1-64"),
    ("report-unicode", body(report="\u00e4b"), "report name must be alphanumeric"),
    ("report-empty", body(report=""), "report name must be alphanumeric"),
    ("save-str", body(save="no"), "save must be true or false"),
    ("save-int", body(save=1), "save must be true or false"),
    ("save-null", body(save=None), "save must be true or false"),
    ("stage-no-spans", {"agentcache": {"stage": [0, 0], "strategy": "pic"}}, "stage needs"),
    ("stage-reversed", body(stage=[40, 24]), "must lie before"),
    ("stage-last-token", body(stage=[0, 64]), "must lie before"),
    ("stage-negative", body(stage=[-1, 3]), "must lie before"),
    ("stage-str", body(stage=["a", 3]), "is not \\[start, end\\]"),
    ("stage-int", body(stage=5), "is not \\[start, end\\]"),
    ("stage-float", body(stage=[1.0, 2]), "is not \\[start, end\\]"),
    ("stage-3", body(stage=[1, 2, 3]), "is not \\[start, end\\]"),
    ("stage-bool", body(stage=[False, True]), "is not \\[start, end\\]"),
    ("min-reused-high", body(min_reused=1.5), "min_reused must be a number in"),
    ("min-reused-negative", body(min_reused=-0.1), "min_reused must be a number in"),
    ("min-reused-str", body(min_reused="0"), "min_reused must be a number in"),
    ("min-reused-bool", body(min_reused=True), "min_reused must be a number in"),
    ("min-reused-nan", body(min_reused=float("nan")), "min_reused must be a number in"),
    ("min-reused-inf", body(min_reused=float("inf")), "min_reused must be a number in"),
]


@pytest.mark.parametrize(("params", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_params_are_prompt_errors_naming_the_field(params: Any, message: str) -> None:
    with pytest.raises(PromptError, match=message):
        RequestSpec.parse(params, N, scope_key="server-key")


SCOPED = [["system", 0, 10, "sys", None], ["fixed", 10, 64, "h", "conv-1"]]


def test_scopes_are_accepted_only_when_the_server_signed_them() -> None:
    good = {"agentcache": {"segments": SCOPED, "scope_sig": sign_scopes([None, "conv-1"], "k")}}
    assert RequestSpec.parse(good, N, "k").spans[1] == SegmentSpan(
        SegmentKind.FIXED, 10, 64, "h", "conv-1"
    )
    with pytest.raises(PromptError, match="not signed"):
        RequestSpec.parse(good, N, "another key")  # a token of another engine / a guess
    with pytest.raises(PromptError, match="client-supplied scopes are refused"):
        RequestSpec.parse(good, N)  # a connector with no key takes no scope at all
    forged = [["system", 0, 10, "sys", None], ["fixed", 10, 64, "h", "conv-2"]]
    moved = {"agentcache": {"segments": forged, "scope_sig": good["agentcache"]["scope_sig"]}}
    with pytest.raises(PromptError, match="not signed"):
        RequestSpec.parse(moved, N, "k")  # a valid signature does not carry to another scope
    for sig in (None, 5, ""):
        with pytest.raises(PromptError, match="not signed"):
            RequestSpec.parse({"agentcache": {"segments": SCOPED, "scope_sig": sig}}, N, "k")


def test_a_spec_round_trips_with_its_signature() -> None:
    spec = RequestSpec.parse({"agentcache": {"segments": SCOPED, "scope_sig": sign_scopes(
        [None, "conv-1"], "k")}}, N, "k")  # fmt: skip
    assert RequestSpec.parse(spec.to_params("k"), N, "k") == spec
    assert "scope_sig" not in RequestSpec(spec.spans[:1]).to_params("k")["agentcache"]


def _junk(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 3 else 6)
    leaves = [None, True, rng.randint(-5, 80), rng.random() * 100, "fixed", "x" * rng.randrange(4)]
    if pick < 6:
        return leaves[pick]
    if pick < 8:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(6))]
    keys = ["segments", "strategy", "report", "save", "stage", "min_reused", "scope_sig", "x"]
    return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_random_junk_is_refused_or_parsed_never_another_exception() -> None:
    rng = random.Random(0)
    outcomes = {"parsed": 0, "refused": 0}
    for _ in range(3000):
        params = {"agentcache": _junk(rng)} if rng.random() < 0.8 else _junk(rng)
        try:
            spec = RequestSpec.parse(params, 8, "k")
        except PromptError:
            outcomes["refused"] += 1
            continue
        outcomes["parsed"] += 1
        assert all(isinstance(s.start, int) and isinstance(s.end, int) for s in spec.spans)
    assert outcomes["refused"] > 100 and outcomes["parsed"] > 100
