"""`agentcache serve`'s tiered segment store: the flags, their refusals before the model loads,
and a conversation spilled to the host tier under pressure, found again on its next request."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentcache.cli import build_parser, main
from agentcache.errors import ConfigError
from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.model.loading import LoadedModel
from agentcache.server import create_app
from agentcache.server.cli import server_config, serving_engine
from agentcache.server.store_options import tier_config
from agentcache.tiers.config import TierConfig
from agentcache.tiers.store import TieredSegmentStore
from tests.conftest import no_model, usage_error

MODEL = "tiny"
CHAT = "/v1/chat/completions"
MiB = 1 << 20


def parse(*flags: str) -> Any:
    return build_parser().parse_args(["serve", *flags])


def engine_of(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
              *flags: str) -> Any:  # fmt: skip
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda model, cache_dir: tiny)
    return serving_engine(parse(*flags), None, tmp_path)


def app_of(engine: Any, flags: list[str]) -> Any:
    """The server of these flags on `engine`, answering the test client's Host."""
    return create_app(engine, server_config(parse(*flags, "--allowed-host", "testserver"), MODEL))


# ---- the flags ----


def test_without_tier_flags_the_store_is_flat_and_sizes_read_as_sizes(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert tier_config(parse()) is None
    engine = engine_of(tiny, monkeypatch, tmp_path, "--store-bytes", "64MiB")
    assert isinstance(engine.store, MemorySegmentStore) and engine.config.tiers is None
    assert engine.store.capacity_bytes == 64 * MiB


def test_tier_flags_give_the_engine_a_tiered_store(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    flags = ["--store-bytes", "8MiB", "--store-host-bytes", "1GiB", "--store-disk-dir",
             str(tmp_path / "disk"), "--store-disk-bytes", "2GiB", "--store-spill", "lru",
             "--retention-share", "0.5"]  # fmt: skip
    assert tier_config(parse(*flags)) == TierConfig(
        fast_bytes=8 * MiB, host_bytes=1 << 30, disk_dir=tmp_path / "disk", disk_bytes=2 << 30,
        spill="lru", retain_share=0.5,
    )  # fmt: skip
    engine = engine_of(tiny, monkeypatch, tmp_path, *flags)
    store = engine.store
    assert isinstance(store, TieredSegmentStore)
    assert [(t.name, t.capacity_bytes) for t in store.tiers] == [
        ("fast", 8 * MiB), ("host", 1 << 30), ("disk", 2 << 30)
    ]  # fmt: skip
    store.close()


def test_a_host_tier_alone_keeps_the_defaults_of_the_rest() -> None:
    tiers = tier_config(parse("--store-host-bytes", "512MiB"))
    assert tiers is not None
    assert (tiers.fast_bytes, tiers.host_bytes, tiers.disk_dir, tiers.spill) == (
        4 << 30, 512 * MiB, None, "slide"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "vllm", "--store-host-bytes", "1GiB"],
         "--store-host-bytes apply to the embedded backend's segment store"),
        (["--backend", "vllm", "--store-spill", "lru", "--store-disk-dir", "d"],
         "--store-disk-dir, --store-spill apply to the embedded backend"),
        (["--store-disk-bytes", "1GiB"], "--store-disk-bytes needs --store-disk-dir"),
        (["--store-spill", "lru"], "--store-spill needs a tier to spill to"),
    ],
)  # fmt: skip
def test_tier_flags_that_cannot_apply_fail_before_the_model_loads(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--store-host-bytes", "12XB"], "argument --store-host-bytes: '12XB' is not a size"),
        (["--store-bytes", "0"], "argument --store-bytes: must be at least 1 byte"),
        (["--store-disk-bytes", "-1"], "argument --store-disk-bytes"),
        (["--store-spill", "fifo"], "argument --store-spill: invalid choice: 'fifo'"),
    ],
)
def test_bad_tier_values_are_usage_errors(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in usage_error(["serve", *argv], capsys)


def refused_folder(folder: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> str:  # fmt: skip
    """Serve with a host tier and `folder` as the disk tier's: refused (exit 2) before the
    model loads; the error."""
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    argv = ["serve", "--port", "0", "--store-host-bytes", "1MiB", "--store-disk-dir", str(folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--store-disk-dir {folder}: disk tier folder" in err and "Traceback" not in err
    return err


def test_a_disk_folder_that_is_a_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "f"
    file.write_text("not a folder")
    assert "is not writable" in refused_folder(file, monkeypatch, capsys)
    assert file.read_text() == "not a folder"


def test_a_disk_folder_holding_a_link_is_refused_and_nothing_is_written_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, outside = tmp_path / "disk", tmp_path / "outside"
    folder.mkdir()
    outside.write_text("keep")
    (folder / "lock").symlink_to(outside)
    assert "holds 1 symbolic link(s)" in refused_folder(folder, monkeypatch, capsys)
    assert outside.read_text() == "keep"


def test_a_dangling_link_as_the_disk_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "disk"
    link.symlink_to(tmp_path / "nowhere" / "at-all")
    refused_folder(link, monkeypatch, capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_disk_folder_that_is_not_writable_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert "is not writable" in refused_folder(folder, monkeypatch, capsys)
    finally:
        folder.chmod(0o700)


def test_a_link_to_a_folder_is_where_the_user_put_the_disk_tier(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As the disk tier has it: the folder itself may be a link (links inside it may not)."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    engine = engine_of(tiny, monkeypatch, tmp_path, "--store-host-bytes", "1MiB",
                       "--store-disk-dir", str(link))  # fmt: skip
    engine.store.close()
    assert (real / "extents").is_dir()


def test_a_fast_tier_too_small_for_a_request_names_the_flags(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="cannot hold one request's working set") as e:
        engine_of(tiny, monkeypatch, tmp_path, "--store-bytes", "1KiB", "--store-host-bytes",
                  "1MiB")  # fmt: skip
    assert "--store-bytes" in str(e.value) and "--kv-pages" in str(e.value)


def test_the_retained_share_is_of_the_fast_tier(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    flags = ["--kv-pages", "32", "--store-bytes", "4MiB", "--store-host-bytes", "64MiB",
             "--retention-share", "0.5"]  # fmt: skip
    engine = engine_of(tiny, monkeypatch, tmp_path, *flags)
    app = app_of(engine, flags)
    with TestClient(app) as c:
        text = c.get("/metrics").text
    assert app.state.chat.retention.store.retention_stats().max_bytes == 2 * MiB
    assert 'agentcache_retained{kind="cap_bytes"} 2.097152e+06' in text
    assert 'agentcache_tier_bytes{kind="capacity",tier="host"} 6.7108864e+07' in text
    assert 'agentcache_tiers{kind="spilled_bytes"} 0.0' in text


# ---- a conversation spilled under pressure, found on its next request ----


def opening(name: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": f"You are agent {name}. " * 12},
            {"role": "user", "content": f"task for {name}: say what you do"}]  # fmt: skip


def turn(c: TestClient, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    r = c.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def metric(text: str, sample: str) -> float:
    (line,) = [x for x in text.splitlines() if x.startswith(sample + " ")]
    return float(line.split()[-1])


@pytest.mark.parametrize("host", [True, False])
def test_a_conversation_spilled_to_the_host_tier_is_found_on_its_next_request(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, host: bool
) -> None:
    """A store that holds two conversations and a half: A's turn, then B's, C's and D's
    push A out of it. With a host tier A's segments were spilled there and A's next request
    finds them (promoted back to fast: cached tokens cover every message A's first turn
    stored); without one they were dropped and A's history is computed again."""
    flags = ["--kv-pages", "32", "--store-bytes", "600KiB"]
    flags += ["--store-host-bytes", "8MiB"] * host
    engine = engine_of(tiny, monkeypatch, tmp_path, *flags)
    app = app_of(engine, flags)
    with TestClient(app) as c:
        first = turn(c, opening("A"))
        for name in "BCD":
            turn(c, opening(name))
        reply = first["choices"][0]["message"]
        again = turn(c, [*opening("A"), reply, {"role": "user", "content": "and then?"}])
        text = c.get("/metrics").text
    stored = sum(s["num_tokens"] for s in first["agentcache"]["segments"] if s["status"] == "new")
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert engine.store.stats.evictions == 0 if host else engine.store.stats.evictions > 0
    if host:
        assert cached >= stored > 0
        assert metric(text, 'agentcache_tiers{kind="spills"}') > 0
        assert metric(text, 'agentcache_tiers{kind="spilled_bytes"}') > 0
        assert metric(text, 'agentcache_tiers{kind="promoted_pages"}') > 0
    else:
        # only openings A's messages share with B's, C's and D's (their chat framing, the
        # system prompt's first words) are found: none of A's own segments
        assert not any(s["status"] in ("hit", "moved") for s in again["agentcache"]["segments"])
        assert cached < 0.2 * stored
        assert "agentcache_tiers{" not in text


LS = {"type": "function", "function": {
    "name": "ls", "description": "list files", "strict": True,
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}  # fmt: skip


def test_a_paused_conversation_spilled_to_the_host_tier_is_prefetched_when_it_resumes(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A's turn ends in a tool call; its retention is refused for the fast tier's share (a
    share too small for it), so B, C and D spill it to the host tier. When A's next request
    (the call's result) arrives, the pause it resumes is prefetched to fast before its lookup,
    which finds every message A's first turn stored."""
    # the tools block makes A's first turn about 900 tokens, of 1 KiB each on the tiny model
    flags = ["--kv-pages", "64", "--store-bytes", "1100KiB", "--store-host-bytes", "8MiB",
             "--retention-share", "0.01"]  # fmt: skip
    engine = engine_of(tiny, monkeypatch, tmp_path, *flags)
    with TestClient(app_of(engine, flags)) as c:
        body = {"model": MODEL, "messages": opening("A"), "tools": [LS], "max_tokens": 40,
                "tool_choice": {"type": "function", "function": {"name": "ls"}}}  # fmt: skip
        r = c.post(CHAT, json=body)
        assert r.status_code == 200, r.text
        first = r.json()
        for name in "BCD":
            turn(c, opening(name))
        call = first["choices"][0]["message"]
        result = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "a.txt"}
        body = {"model": MODEL, "messages": [*opening("A"), call, result], "tools": [LS],
                "max_tokens": 4}  # fmt: skip
        again = c.post(CHAT, json=body).json()
        text = c.get("/metrics").text
    kept, resumed = (r["agentcache"]["cache_control"] for r in (first, again))
    assert kept["retention_source"] == "learned" and kept["refused_segments"] > 0
    assert resumed["resumed_after_s"] is not None and resumed["prefetched_pages"] > 0
    assert metric(text, 'agentcache_tiers{kind="prefetched_pages"}') == resumed["prefetched_pages"]
    stored = sum(s["num_tokens"] for s in first["agentcache"]["segments"] if s["status"] == "new")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= stored > 0
