from __future__ import annotations

import json
import random
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcache.bench.server import counters
from agentcache.bench.server.agents import Phase, TurnRecord, load_sessions
from agentcache.bench.server.chat_client import TurnResult, reply_key, stream_turn
from agentcache.bench.server.pauses import PauseModel
from agentcache.bench.server.replay_summary import ratios, summarize_phase
from agentcache.bench.server.targets import (
    VLLM_SERVE,
    Target,
    TargetOptions,
    command,
    needs_phase_store,
    parse_targets,
    phase_store_args,
    thread_env,
)
from agentcache.bench.stats import percentile
from agentcache.chat.tools import chat_template
from tests.bench.scripts import load_script

replay = load_script("server/replay")
CHAT = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads" / "chat.jsonl"
PATH_ARG = {"type": "object", "properties": {"path": {"type": "string"}}}
LS = {"name": "ls", "description": "list files", "parameters": PATH_ARG}
TOOLS = [{"type": "function", "function": LS}]


def test_pauses_are_reproducible_by_seed_and_session_alone() -> None:
    m = PauseModel(median_s=2.0, sigma=1.0, max_s=30.0)
    a = m.session_pauses(7, "chat-09", 6)
    assert len(a) == 5 and a == m.session_pauses(7, "chat-09", 6)
    assert m.session_pauses(7, "chat-09", 4) == a[:3]  # a prefix of the same draws
    assert a != m.session_pauses(8, "chat-09", 6) and a != m.session_pauses(7, "chat-11", 6)
    assert m.session_pauses(7, "x", 1) == []


def test_pauses_follow_the_median_and_the_cap() -> None:
    m = PauseModel(median_s=2.0, sigma=1.0, max_s=30.0)
    rng = random.Random(0)
    draws = [m.draw(rng) for _ in range(4000)]
    assert max(draws) == 30.0  # some draws exceed the cap and are held at it
    assert 1.8 < percentile(draws, 0.5) < 2.2  # type: ignore[operator]
    assert PauseModel(0.5, 0.0, 10.0).session_pauses(0, "s", 4) == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError):
        PauseModel(median_s=0.0)
    with pytest.raises(ValueError):
        PauseModel(sigma=-1.0)


def test_percentile_is_nearest_rank() -> None:
    values = [float(x) for x in range(100, 0, -1)]  # 1..100, unordered
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0, 1.0], 0.5) == 1.0 and percentile([3.0, 1.0], 0.99) == 3.0
    assert percentile([4.0], 0.99) == 4.0
    assert percentile([], 0.5) is None
    with pytest.raises(ValueError):
        percentile([1.0], 0.0)


def test_the_schedule_rotates_targets_and_runs_solo_first() -> None:
    phases = replay.schedule(["a", "b", "c"], [1, 4], 2)
    assert phases[:6] == [(0, "a", 0), (0, "a", 1), (0, "a", 4), (0, "b", 0), (0, "b", 1),
                          (0, "b", 4)]  # fmt: skip
    assert [t for r, t, n in phases if r == 1 and n == 1] == ["b", "c", "a"]
    for target in "abc":
        mine = [(r, n) for r, t, n in phases if t == target]
        assert mine.count((0, 0)) == 1 and mine[0] == (0, 0)
        assert sorted(n for _, n in mine if n) == [1, 1, 4, 4]


def test_sessions_by_split_name_and_count() -> None:
    validate = load_sessions(CHAT)
    assert [s.name for s in validate] == [f"chat-{i:02d}" for i in range(8, 16)]
    assert len(load_sessions(CHAT, "all")) == 16
    picked = load_sessions(CHAT, "all", ["chat-03", "chat-10"])
    assert [s.name for s in picked] == ["chat-03", "chat-10"]
    assert picked[0].case == "tool-use" and picked[0].requests[0]["tools"]
    for s in validate:  # each request ends where the model answers; tool results are there
        assert all(r["messages"][-1]["role"] in ("user", "tool") for r in s.requests)
    assert any(m["role"] == "tool" for s in validate for m in s.requests[-1]["messages"])
    assert len(load_sessions(CHAT, "tune", n=3)) == 3
    with pytest.raises(ValueError, match="chat-99"):
        load_sessions(CHAT, "all", ["chat-99"])


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def test_a_stream_folds_into_reply_ttft_and_usage() -> None:
    sent: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "c", "function": {"name": "ls", "arguments": '{"pa'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": 'th": "/"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
         "agentcache": {"ttft_s": 0.25}},
        {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 9,
                                  "prompt_tokens_details": {"cached_tokens": 32}}},
    ]  # fmt: skip

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, content=sse(events),
                              headers={"X-Agentcache-Conversation": "tok"})  # fmt: skip

    with httpx.Client(base_url="http://t", transport=httpx.MockTransport(handler)) as http:
        r = stream_turn(http, "m", {"messages": [{"role": "user", "content": "hi"}],
                                    "tools": TOOLS}, 16)  # fmt: skip
    assert r.reply == reply_key("", [("ls", '{"path": "/"}')])
    assert (r.finish_reason, r.server_ttft_s, r.conversation) == ("tool_calls", 0.25, "tok")
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (40, 9, 32)
    assert 0 <= r.ttft_s <= r.latency_s
    body = sent[0]
    assert body["temperature"] == 0 and body["stream"] and body["tools"] == TOOLS
    assert body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 16
    assert "cache_salt" not in body
    with httpx.Client(base_url="http://t", transport=httpx.MockTransport(handler)) as http:
        stream_turn(http, "m", {"messages": [{"role": "user", "content": "hi"}]}, 4, salt="t-1")
    assert sent[1]["cache_salt"] == "t-1"  # the tenant the session replays as


def test_a_stream_without_usage_or_report_gives_none() -> None:
    events = [
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse(events))

    with httpx.Client(base_url="http://t", transport=httpx.MockTransport(handler)) as http:
        r = stream_turn(http, "m", {"messages": [{"role": "user", "content": "hi"}]}, 4)
    assert r.reply == reply_key("Hello", [])
    assert r.server_ttft_s is None and r.prompt_tokens is None and r.conversation is None


def result(reply: str, prompt: int = 10, cached: int = 4, ttft: float = 0.1) -> TurnResult:
    return TurnResult(reply, "stop", ttft, ttft + 0.1, None, prompt, 2, cached, None)


def test_a_phase_summary_counts_add_up() -> None:
    turns = [TurnRecord("a", 0, 0, 0.0, result("x", cached=0)),
             TurnRecord("a", 1, 0, 1.0, result("y", ttft=0.3)),
             TurnRecord("b", 0, 1, 0.0, result("z", cached=0)),
             TurnRecord("b", 1, 1, 1.0, None, "TurnError: status 503")]  # fmt: skip
    phase = Phase(wall_s=2.0, turns=turns, jct_s={"a": 1.5})
    solo = {("a", 0): "x", ("a", 1): "other", ("b", 0): "z", ("b", 1): "w"}
    s = summarize_phase(phase, solo, {"preemptions": 1.0, "spilled_bytes": None})
    assert (s["requests"], s["ok"], s["errors"], s["sessions_finished"]) == (4, 3, 1, 1)
    assert (s["replies_compared"], s["replies_differing"]) == (3, 1)
    assert s["differing_turns"] == [["a", 1]]
    assert (s["prompt_tokens"], s["cached_tokens"], s["completion_tokens"]) == (30, 4, 6)
    assert s["prompt_tok_s"] == 15.0 and s["decode_tok_s"] == 3.0
    assert s["computed_prompt_tok_s"] == 13.0
    assert s["ttft_first_s"]["n"] == 2 and s["ttft_resumed_s"] == {"p50": 0.3, "p99": 0.3, "n": 1}
    assert s["ttft_resumed_p50_s"] == 0.3
    assert s["server_ttft_resumed_s"]["p99"] is None
    assert s["counters"]["spilled_bytes"] is None


def test_ratios_pair_targets_within_a_round() -> None:
    def run(target: str, rnd: int, tok_s: float) -> dict[str, Any]:
        return {"target": target, "clients": 4, "round": rnd,
                "summary": {"decode_tok_s": tok_s, "prompt_tok_s": None}}  # fmt: skip

    runs = [run("a", 0, 10.0), run("b", 0, 20.0), run("a", 1, 5.0), run("b", 1, 5.0)]
    r = ratios(runs, "a")
    assert r == {"b": {"4": {"decode_tok_s": 1.5, "prompt_tok_s": None,
                             "ttft_first_p99_s": None, "ttft_resumed_p50_s": None,
                             "ttft_resumed_p99_s": None,
                             "jct_p50_s": None}}}  # fmt: skip


PAGE_AGENTCACHE = """# HELP agentcache_batch x
agentcache_batch{kind="preempted"} 3.0
agentcache_batch{kind="swapped_bytes"} 4096.0
agentcache_requests_total{endpoint="chat",status="200"} 9.0
"""
PAGE_TIERS = """agentcache_tiers{kind="spilled_bytes"} 65536.0
agentcache_tiers{kind="spilled_pages"} 4.0
agentcache_tiers{kind="prefetched_pages"} 3.0
agentcache_tiers{kind="promoted_pages"} 1.0
agentcache_tier_bytes{kind="held",tier="host"} 65536.0
"""
PAGE_VLLM = """vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 64.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 128.0
"""


def test_counters_read_each_server_and_say_none_for_what_it_lacks() -> None:
    a = counters.quantities(PAGE_AGENTCACHE)
    assert (a["preemptions"], a["swapped_bytes"]) == (3.0, 4096.0)
    assert a["spilled_bytes"] is None and a["prefix_hits"] is None
    v = counters.quantities(PAGE_VLLM)
    assert (v["preemptions"], v["prefix_hits"], v["prefix_queries"]) == (2.0, 64.0, 128.0)
    assert v["swapped_bytes"] is None
    later = counters.quantities(PAGE_AGENTCACHE.replace("3.0", "5.0"))
    d = counters.difference(a, later)
    assert d["preemptions"] == 2.0 and d["swapped_bytes"] == 0.0 and d["spilled_bytes"] is None
    t = counters.quantities(PAGE_AGENTCACHE + PAGE_TIERS)
    assert (t["spilled_bytes"], t["prefetched_pages"], t["promoted_pages"]) == (65536.0, 3.0, 1.0)
    assert a["prefetched_pages"] is None and v["promoted_pages"] is None


def test_target_commands() -> None:
    tiny = TargetOptions(model="tiny")
    assert command("embedded-prefix", 9, tiny)[-2:] == ["--strategy", "prefix"]
    with pytest.raises(ValueError, match="model folder"):
        command("vllm", 9, tiny)
    with pytest.raises(ValueError, match="--vllm-python"):
        command("vllm-backend", 9, TargetOptions())
    opts = TargetOptions(vllm_python="/v/bin/python", model_folder="/m")
    plain = command("vllm", 9, opts)
    assert plain[:4] == ["/v/bin/python", str(VLLM_SERVE), "serve", "/m"]
    assert "--enable-prefix-caching" in plain and VLLM_SERVE.is_file()
    # plain vLLM renders messages and tools with the template of agentcache's own rendering
    template = plain[plain.index("--chat-template") + 1]
    assert template == str(chat_template()) and Path(template).is_file()
    own = command(
        "vllm", 9, TargetOptions(vllm_python="/v", model_folder="/m", vllm_chat_template=None)
    )
    assert "--chat-template" not in own
    backend = command("vllm-backend", 9, opts)
    assert backend[0] == "/v/bin/python" and backend[-2:] == ["--backend", "vllm"]
    # every target gets the run's thread count; plain vLLM unbound, as agentcache's servers are
    assert thread_env("vllm", 1) == {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert thread_env("vllm-backend", 2) == {"AGENTCACHE_NUM_THREADS": "2"}
    # a vLLM-backend phase starts on an empty store folder of its own, unless it names one
    own, given, embedded = parse_targets(
        ["vllm-backend", "vllm-backend@s", "embedded"], ["vllm-backend@s=--store-dir /s"]
    )
    assert needs_phase_store(own) and not needs_phase_store(given)
    assert not needs_phase_store(embedded)
    assert phase_store_args("/tmp/x") == ("--store-dir", "/tmp/x")


def test_a_variant_is_its_target_with_more_server_arguments_last() -> None:
    spec = "embedded@tiers=--store-bytes 64MiB --store-host-bytes '1 GiB'"
    embedded, tiers, backend = parse_targets(
        ["embedded", "embedded@tiers", "vllm-backend"], [spec, "vllm-backend=--max-active 16"]
    )
    assert embedded == Target("embedded", "embedded")
    assert tiers == Target("embedded@tiers", "embedded",
                           ("--store-bytes", "64MiB", "--store-host-bytes", "1 GiB"))  # fmt: skip
    assert backend == Target("vllm-backend", "vllm-backend", ("--max-active", "16"))
    opts = TargetOptions(vllm_python="/v/bin/python", model_folder="/m")
    assert command(tiers, 9, opts)[-4:] == list(tiers.args)
    assert command(tiers, 9, opts)[:-4] == command("embedded", 9, opts)
    assert command(backend, 9, opts)[-4:] == ["--backend", "vllm", "--max-active", "16"]
    tiny = command(Target("embedded-prefix@x", "embedded-prefix", ("--kv-pages", "64")), 9,
                   TargetOptions(model="tiny"))  # fmt: skip
    assert tiny[-4:] == ["--strategy", "prefix", "--kv-pages", "64"]
    (plain,) = parse_targets(["vllm"])
    assert plain == Target("vllm", "vllm") and "--max-active" not in command(plain, 9, opts)


@pytest.mark.parametrize(
    ("labels", "target_args", "message"),
    [
        (["sglang"], [], "unknown target 'sglang'"),
        (["sglang@x"], ["sglang@x=--a"], "unknown target 'sglang@x'"),
        (["embedded@"], [], "unknown target 'embedded@'"),
        (["vllm"], ["vllm=--max-num-seqs 8"], "plain vllm takes --vllm-serve-args"),
        (["vllm@big"], ["vllm@big=--max-num-seqs 8"], "plain vllm takes --vllm-serve-args"),
        (["embedded@tiers"], [], "variant 'embedded@tiers' needs its server arguments"),
        (["embedded"], ["embedded@tiers=--a"], "for 'embedded@tiers', which --targets does not"),
        (["embedded"], ["embedded"], "takes LABEL=ARGS"),
        (["embedded"], ["=--a"], "takes LABEL=ARGS"),
        (["embedded"], ["embedded=--a", "embedded=--b"], "gives 'embedded' twice"),
        (["embedded", "embedded"], [], "'embedded' is named twice"),
        (["embedded"], ["embedded=--a 'open"], "--target-args for 'embedded': No closing"),
    ],
)
def test_bad_targets_and_target_args_are_named(
    labels: list[str], target_args: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_targets(labels, target_args)


def test_bad_target_args_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        replay.parse_args(["--out", "o", "--targets", "embedded,vllm",
                           "--target-args", "vllm=--max-num-seqs 8"])  # fmt: skip
    assert e.value.code == 2
    assert "plain vllm takes --vllm-serve-args" in capsys.readouterr().err
    args = replay.parse_args(["--out", "o", "--targets", "embedded@a,embedded",
                              "--target-args", "embedded@a=--kv-pages 64"])  # fmt: skip
    assert [t.label for t in args.target_specs] == ["embedded@a", "embedded"]


def test_a_chat_template_that_is_no_file_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as e:
        replay.parse_args(["--out", "o", "--vllm-chat-template", str(tmp_path / "none.jinja")])
    assert e.value.code == 2 and "--vllm-chat-template" in capsys.readouterr().err
    for ok in ("agentcache", "model", str(chat_template())):
        assert (
            replay.parse_args(["--out", "o", "--vllm-chat-template", ok]).vllm_chat_template == ok
        )


def workload(path: Path) -> Path:
    """Two short sessions of three turns: a dialogue, and a tool-use session whose requests
    carry the recorded calls and their results."""
    system = {"role": "system", "content": "You are brief."}
    dialogue: list[dict[str, Any]] = [system, {"role": "user", "content": "Hello there."}]
    tools: list[dict[str, Any]] = [system, {"role": "user", "content": "List the files."}]
    turns: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    for i in range(3):
        turns[0].append({"messages": list(dialogue), "max_new_tokens": 6})
        turns[1].append({"messages": list(tools), "tools": TOOLS, "max_new_tokens": 6})
        dialogue += [{"role": "assistant", "content": f"reply {i}"},
                     {"role": "user", "content": f"And then {i}?"}]  # fmt: skip
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "ls", "arguments": json.dumps({"path": f"/d{i}"})},
        }
        result = {"role": "tool", "tool_call_id": f"call_{i}", "content": f"a{i}.txt"}
        tools += [{"role": "assistant", "content": "", "tool_calls": [call]}, result]
    lines = [{"name": "d-0", "case": "dialogue", "turns": turns[0]},
             {"name": "t-1", "case": "tool-use", "turns": turns[1]}]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


# the tiny model's KV is 1 KiB a token: a fast tier of a 64-page pool's 1,024 tokens, and more
TIERS = "embedded@tiers=--kv-pages 64 --store-bytes 1100KiB --store-host-bytes 8MiB"


@pytest.mark.parametrize("tenants", [1, 2])
def test_replay_end_to_end_on_the_tiny_model(tmp_path: Path, tenants: int) -> None:
    out = tmp_path / "out"
    argv = ["--model", "tiny", "--workload", str(workload(tmp_path / "w.jsonl")),
            "--clients", "2", "--targets", "embedded@tiers", "--pause-median", "0.005",
            "--pause-max", "0.02", "--out", str(out), "--target-args", TIERS,
            "--tenants", str(tenants)]  # fmt: skip
    assert replay.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    salts = [s["salt"] for s in results["sessions"]]
    assert salts == ([None, None] if tenants == 1 else ["tenant-0", "tenant-1"])
    assert results["config"]["tenants"] == tenants
    assert {"provenance", "config", "sessions", "pauses", "levels", "ratios", "solo",
            "runs"} <= set(results)  # fmt: skip
    assert results["provenance"]["command"].startswith("python benchmarks/server/replay.py")
    assert {k: len(v) for k, v in results["pauses"].items()} == {"d-0": 2, "t-1": 2}
    assert all(0 < p <= 0.02 for ps in results["pauses"].values() for p in ps)
    assert len(results["solo"]["embedded@tiers"]) == 6
    args = ["--kv-pages", "64", "--store-bytes", "1100KiB", "--store-host-bytes", "8MiB"]
    assert results["config"]["target_args"] == {"embedded@tiers": args}
    (run,) = results["runs"]
    s = run["summary"]
    assert (run["target"], run["clients"]) == ("embedded@tiers", 2)
    assert run["argv"][-6:] == args
    assert (s["requests"], s["ok"], s["errors"], s["sessions_finished"]) == (6, 6, 0, 2)
    assert s["replies_compared"] == 6 and s["replies_differing"] == 0
    assert s["ttft_first_s"]["n"] == 2 and s["ttft_resumed_s"]["n"] == 4
    assert s["server_ttft_resumed_s"]["n"] == 4  # agentcache reports its prefill time
    solo = {(t["session"], t["turn"]): t["reply"] for t in results["solo"]["embedded@tiers"]}
    assert {(t["session"], t["turn"]): t["reply"] for t in run["turns"]} == solo
    assert s["prompt_tokens"] == sum(t["prompt_tokens"] for t in run["turns"])
    assert 0 < s["cached_tokens"] < s["prompt_tokens"]  # later turns reuse earlier ones
    assert s["counters"]["preemptions"] == 0.0 and s["counters"]["prefix_hits"] is None
    assert s["counters"]["spilled_bytes"] is not None  # the tiered store's, read from /metrics
    assert set(s["jct_by_session"]) == {"d-0", "t-1"}
    cell = results["levels"]["embedded@tiers"]["2"]
    assert cell["replies_differing"] == 0 and cell["rounds"] == 1
    report = (out / "report.md").read_text()
    assert report.startswith("# Concurrent agents")
    assert ("replay as 2 tenants" in report) == (tenants == 2)
    assert f"`embedded@tiers`: `{shlex.join(args)}`" in report
    assert "| embedded@tiers | 2 |" in report
    assert (out / "replay.png").stat().st_size > 0


def test_session_kv_counts_each_sessions_last_prompt_as_the_server_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session_kv = load_script("server/session_kv")
    tokens = [("a", 100, 20), ("b", 30, 10)]
    assert session_kv.sizes(tokens, 1024, 0.25) == {
        "tokens": 160, "kv_bytes": 160 * 1024, "share_bytes": 40 * 1024, "kv_pages": 8,
        "min_fast_bytes": 8 * 16 * 1024,
    }  # fmt: skip
    path = workload(tmp_path / "w.jsonl")
    assert session_kv.main(["--model", "tiny", "--workload", str(path), "--split", "all"]) == 0
    out = capsys.readouterr().out
    assert "d-0: " in out and "t-1: " in out and "all 2: " in out and "--kv-pages " in out
    tool_prompt = int(out.split("t-1: ")[1].split()[0])
    dialogue_prompt = int(out.split("d-0: ")[1].split()[0])
    assert tool_prompt > dialogue_prompt  # the tools block counts
