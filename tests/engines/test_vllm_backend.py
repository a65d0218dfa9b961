"""The vLLM backend's bookkeeping that needs no vLLM: the merged transfer report, misses,
stop strings, how many requests it takes at once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentcache.cli import build_parser, main
from agentcache.engines.vllm import IN_PROCESS_ENV
from agentcache.engines.vllm.backend import (
    VLLMBackend,
    _check_in_process,
    _misses,
    filled_token_reuse,
)
from agentcache.engines.vllm.config import VLLMConfig
from agentcache.engines.vllm.modes import span_runs
from agentcache.engines.vllm.reports import RequestStats, write_report
from agentcache.errors import ConfigError
from agentcache.kv.store import MissReason
from agentcache.reuse.base import ReuseStats, SegmentMiss
from agentcache.runtime.stats import TokenReuse
from agentcache.server.cli import check_flags, flag_max_active, server_config
from tests.conftest import no_model


def _backend(store: Path) -> VLLMBackend:
    backend = object.__new__(VLLMBackend)  # no vLLM engine: only the report's inputs
    backend.store_dir = str(store)
    backend.last_transfer = {}
    return backend


def test_transfer_report_folds_the_schedulers_findings_into_the_workers(tmp_path: Path) -> None:
    """The worker's report file overrides the counters the scheduler saw, so the scheduler's
    own misses and fallback reasons travel under keys of their own and are added here."""
    worker = RequestStats("segments", claimed_tokens=40, fallbacks=1, fallback_reasons=("worker",),
                          misses=(("h", "fixed", 35, "evicted"),))  # fmt: skip
    write_report(tmp_path, "r1", worker)
    sent = SimpleNamespace(extra_args={"kv_transfer_params": {"agentcache": {"report": "r1"}}})
    out = SimpleNamespace(kv_transfer_params={"agentcache": {
        "mode": "segments", "vllm_cached_tokens": 64, "fallbacks": 0, "fallback_reasons": [],
        "misses": [], "scheduler_misses": [["s", "system", 10, "new"]],
        "scheduler_fallback_reasons": ["declined"],
    }})  # fmt: skip
    backend = _backend(tmp_path)
    info = backend.transfer_report(sent, out)
    assert info["fallbacks"] == 2 and info["fallback_reasons"] == ["worker", "declined"]
    assert info["misses"] == [["h", "fixed", 35, "evicted"], ["s", "system", 10, "new"]]
    assert info["vllm_cached_tokens"] == 64 and info["claimed_tokens"] == 40
    assert "scheduler_misses" not in info and backend.last_transfer == info
    assert not (tmp_path / "reports" / "r1.json").exists()  # read once, then removed
    assert _misses(info["misses"]) == (
        SegmentMiss("h", "fixed", 35, MissReason.EVICTED),
        SegmentMiss("s", "system", 10, MissReason.NEW),
    )


def test_a_request_without_a_report_keeps_the_schedulers_part(tmp_path: Path) -> None:
    sent = SimpleNamespace(extra_args={})
    out = SimpleNamespace(kv_transfer_params=None)
    info = _backend(tmp_path).transfer_report(sent, out)
    assert info == {"fallbacks": 0, "fallback_reasons": [], "misses": []}


@pytest.mark.vllm
def test_in_process_needs_the_entry_points_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library never sets vLLM's environment: without the entry point's setting an
    in-process backend refuses to start, naming the variable."""
    pytest.importorskip("vllm")
    monkeypatch.setenv(IN_PROCESS_ENV, "1")
    with pytest.raises(ConfigError, match=f"in_process=True needs {IN_PROCESS_ENV}=0"):
        _check_in_process()
    monkeypatch.setenv(IN_PROCESS_ENV, "0")
    _check_in_process()


def _sized(blocks: int | None, **config: int) -> VLLMBackend:
    backend = object.__new__(VLLMBackend)  # no vLLM engine: its cache config stands in
    backend.config = VLLMConfig(block_size=32, **config)
    cache = SimpleNamespace(num_gpu_blocks=blocks)
    backend.llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(
        cache_config=cache)))  # fmt: skip
    return backend


def test_max_active_is_max_num_seqs_and_kv_tokens_what_the_kv_cache_holds() -> None:
    assert _sized(1000, max_model_len=2048).max_active == 256  # vLLM's max_num_seqs
    assert _sized(1000, max_num_seqs=4).max_active == 4
    assert _sized(1000).kv_tokens == 32000  # blocks of 32 tokens
    assert _sized(None).kv_tokens is None  # blocks unknown: no token bound


def test_serve_on_vllm_defaults_max_active_and_its_tokens_to_the_backends() -> None:
    parse = build_parser().parse_args
    on_vllm = server_config(parse(["serve", "--backend", "vllm"]), "m", 12, 9000, 32)
    assert (on_vllm.max_active, on_vllm.max_active_tokens) == (12, 9000)
    assert on_vllm.prefix_block_tokens == 32  # prefix blocks requests share count once
    flags = ["serve", "--backend", "vllm", "--max-active", "3", "--max-active-tokens", "50"]
    given = server_config(parse(flags), "m", 12, 9000)
    assert (given.max_active, given.max_active_tokens) == (3, 50)
    embedded = server_config(parse(["serve"]), "m", None, 9000)
    assert embedded.max_active_tokens is None  # its engine admits by KV pages
    tokens = parse(["serve", "--max-active-tokens", "4096"])
    assert server_config(tokens, "m").max_active_tokens == 4096
    tenant = parse(["serve", "--backend", "vllm", "--max-active-per-tenant", "5"])
    assert flag_max_active(tenant) is None  # the engine's, once it has loaded
    check_flags(tenant, None)  # before it loads: the per-tenant bound waits for its value
    with pytest.raises(ConfigError, match="exceeds --max-active 4"):
        server_config(tenant, "m", 4)
    assert server_config(parse(["serve"]), "m", 12).max_active == 16  # embedded: its own


def test_serve_checks_the_per_tenant_bound_once_max_active_is_final(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-active given: the bound fails before anything loads; vLLM's default: it waits
    for the engine (vLLM reported absent is then the first failure)."""
    import agentcache.engines.vllm as vllm_pkg
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    monkeypatch.setattr(vllm_pkg, "installed_vllm_version", lambda: None)
    tenant = ["serve", "--port", "0", "--max-active-per-tenant", "5"]
    assert main([*tenant, "--max-active", "4"]) == 2
    assert "--max-active-per-tenant 5 exceeds --max-active 4" in capsys.readouterr().err
    assert main([*tenant, "--backend", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and "exceeds" not in err


def test_the_shared_folders_bound_comes_from_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--vllm-folder-bytes` sizes the folder the connector evicts to (and the retained share
    is of it); without it, the connector's default."""
    from agentcache.server.cli import vllm_config
    from tests.conftest import usage_error

    parse = build_parser().parse_args
    flags = ["serve", "--backend", "vllm", "--vllm-folder-bytes", "256MiB"]
    config = vllm_config(parse(flags), None, "rpdc", tmp_path)
    assert config.folder_bytes == 256 << 20 and config.store_dir == str(tmp_path / "vllm-store")
    default = vllm_config(parse(["serve", "--backend", "vllm"]), None, "rpdc", tmp_path)
    assert default.folder_bytes == VLLMConfig().folder_bytes == 16 << 30
    for bad in ("0", "lots", "-1GiB"):
        assert "--vllm-folder-bytes" in usage_error(["serve", "--vllm-folder-bytes", bad], capsys)
    with pytest.raises(ValueError, match="folder_bytes must be >= 1"):
        VLLMConfig(folder_bytes=0)


def test_kv_bytes_sizes_vllms_kv_memory_and_a_size_short_of_one_sequence_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--kv-bytes` is vLLM's paged KV memory on `--backend vllm` (1 GiB without it); memory
    that cannot hold one `--max-model-len` sequence is a `ConfigError` naming both flags and
    the bytes needed, before vLLM loads. The default model's 46080 bytes a token: 1 GiB holds
    23296 tokens in blocks of 32, so a sequence of up to 23264 and the block vLLM keeps
    beside it."""
    from agentcache.engines.vllm.backend import check_kv_memory, kv_bytes_per_token
    from agentcache.server.cli import vllm_config
    from tests.conftest import usage_error

    parse = build_parser().parse_args
    config = vllm_config(parse(["serve", "--backend", "vllm", "--kv-bytes", "256MiB"]), None,
                         "rpdc", tmp_path)  # fmt: skip
    assert config.kv_cache_bytes == 256 << 20
    default = vllm_config(parse(["serve", "--backend", "vllm"]), None, "rpdc", tmp_path)
    assert default.kv_cache_bytes == VLLMConfig().kv_cache_bytes == 1 << 30
    with pytest.raises(ValueError, match="kv_cache_bytes must be >= 1"):
        VLLMConfig(kv_cache_bytes=0)
    for bad in ("0", "lots", "-1GiB", "1.5.2GiB"):
        flags = ["serve", "--backend", "vllm", "--kv-bytes", bad]
        assert "--kv-bytes" in usage_error(flags, capsys)
    cfg = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "hidden_size": 576}  # fmt: skip
    (tmp_path / "config.json").write_text(__import__("json").dumps(cfg))
    assert kv_bytes_per_token(tmp_path, "float32") == 46080
    assert kv_bytes_per_token(tmp_path, "bfloat16") == 23040
    check_kv_memory(tmp_path, VLLMConfig(kv_cache_bytes=1 << 30, max_model_len=23264))
    with pytest.raises(ConfigError) as e:  # one block beside the sequence: vLLM's own bound
        check_kv_memory(tmp_path, VLLMConfig(kv_cache_bytes=1 << 30, max_model_len=23265))
    assert "holds 23296 tokens" in str(e.value) and "--max-model-len 23265" in str(e.value)
    assert "--kv-bytes" in str(e.value) and f"at least {23328 * 46080} bytes" in str(e.value)


def test_kv_bytes_beyond_the_memory_vllm_would_use_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More KV memory than the GPU (or, on CPU, the machine) holds is a `ConfigError` naming
    both sizes before vLLM loads."""
    import agentcache.engines.vllm.backend as backend

    cfg = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "hidden_size": 576}  # fmt: skip
    (tmp_path / "config.json").write_text(__import__("json").dumps(cfg))
    with pytest.raises(ConfigError, match=r"exceeds the [0-9]+ bytes of the memory"):
        backend.check_kv_memory(tmp_path, VLLMConfig(kv_cache_bytes=1 << 62))
    monkeypatch.setattr(backend, "kv_device_memory", lambda: 2 << 30)
    backend.check_kv_memory(tmp_path, VLLMConfig(kv_cache_bytes=2 << 30))
    with pytest.raises(ConfigError) as e:
        backend.check_kv_memory(tmp_path, VLLMConfig(kv_cache_bytes=(2 << 30) + 1))
    message = str(e.value)
    assert f"{(2 << 30) + 1} bytes (--kv-bytes" in message and f"{2 << 30} bytes" in message


def test_a_filled_turns_token_use_is_vllms_hit_the_workers_runs_then_vllm() -> None:
    """Fill "engine": [0, hit) vLLM's own (exact), the claimed span as the worker's runs say,
    the rest vLLM computed; what cannot be told from the report is None, not a guess."""

    def runs(uses: TokenReuse | None) -> list[tuple[int, int, str]] | None:
        return None if uses is None else [(s, e, u.value) for s, e, u in uses.runs]

    assert runs(filled_token_reuse(10, {}, 5)) == [(0, 5, "exact"), (5, 10, "computed")]
    spans = [[4, 6, "moved"], [6, 7, "computed"], [7, 9, "refreshed"]]
    claimed = {"vllm_cached_tokens": 4, "planned_tokens": 5, "token_runs": spans}
    assert runs(filled_token_reuse(10, claimed, 9)) == [
        (0, 4, "exact"), (4, 6, "moved"), (6, 7, "computed"), (7, 9, "refreshed"),
        (9, 10, "computed"),
    ]  # fmt: skip
    assert filled_token_reuse(10, claimed, 8) is None  # vLLM cached other than the claim's end
    assert filled_token_reuse(10, {**claimed, "token_runs": []}, 9) is None  # use not known
    assert filled_token_reuse(10, {**claimed, "vllm_cached_tokens": 3}, 9) is None  # a gap
    twice = {**claimed, "token_runs": [*spans, [4, 6, "moved"]]}  # claimed again
    assert filled_token_reuse(10, twice, 9) is None
    odd = {**claimed, "token_runs": [[4, 9, "borrowed"]]}
    assert filled_token_reuse(10, odd, 9) is None
    assert filled_token_reuse(10, {"vllm_cached_tokens": 11}, 11) is None


def test_the_workers_span_runs_are_the_strategys_masks_clipped_to_the_span() -> None:
    stats = ReuseStats(10, 1, reused_tokens=6, recomputed_tokens=4)
    stats.reused = torch.tensor([True] * 4 + [False, True, True, True, False, False])
    stats.exact = torch.tensor([True] * 4 + [False] * 6)
    stats.dirty = torch.tensor([False] * 6 + [True, False, False, False])
    assert span_runs(stats, 2, 9) == (
        (2, 4, "exact"), (4, 5, "computed"), (5, 6, "moved"), (6, 7, "refreshed"),
        (7, 8, "moved"), (8, 9, "computed"),
    )  # fmt: skip
    assert span_runs(ReuseStats(10, 1, reused_tokens=3), 2, 9) == ()  # no masks kept
    report = RequestStats("segments", token_runs=((2, 4, "exact"),))
    assert RequestStats.from_dict(report.as_dict()) == report
    assert report.merge(RequestStats("segments", token_runs=((4, 5, "moved"),))).token_runs == (
        (2, 4, "exact"), (4, 5, "moved"),
    )  # fmt: skip
