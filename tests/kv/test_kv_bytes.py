"""Sizing the engine's page pool by bytes: the size argument, the config, the engine's pool."""

from __future__ import annotations

import argparse

import pytest

from agentcache.argtypes import byte_size
from agentcache.errors import ConfigError, ContextLengthError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.config import EngineConfig
from agentcache.runtime.engine import Engine
from agentcache.units import GiB, MiB, format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "value"),
    [("2GiB", 2 * GiB), ("512MiB", 512 * MiB), ("512mib", 512 * MiB), ("1.5G", 1_500_000_000),
     ("4096", 4096), ("4096B", 4096), (" 3 KiB ", 3072), ("1GB", 10**9)],
)  # fmt: skip
def test_sizes_in_bytes_parse(text: str, value: int) -> None:
    assert parse_bytes(text) == value
    assert byte_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "2 GiBB", "1e9", "two", "0", "0.1"])
def test_a_size_that_is_not_one_is_refused_by_name(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as e:
        byte_size(text)
    assert repr(text) in str(e.value)


def test_format_bytes() -> None:
    assert format_bytes(2 * GiB) == "2.0 GiB" and format_bytes(1536) == "1.5 KiB"
    assert format_bytes(12) == "12 B"


def test_kv_bytes_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="kv_bytes must be >= 1"):
        EngineConfig(kv_bytes=0)


def test_kv_bytes_sizes_the_engines_pool_and_its_context(tiny: LoadedModel) -> None:
    c = tiny.config
    page_bytes = 2 * c.num_layers * 16 * c.num_kv_heads * c.head_dim * 4
    engine = Engine(tiny, EngineConfig(kv_pages=2048, kv_bytes=5 * page_bytes + 1))
    assert engine.ctx.pool.config.num_pages == 5  # kv_pages is not read
    assert engine.ctx.pool.touched_pages == 0
    assert engine.max_context == min(5 * 16, c.max_position_embeddings)
    long = SegmentedPrompt([Segment(SegmentKind.UPDATE, "word " * 200, "u", "user")])
    with pytest.raises(ContextLengthError) as e:  # a prompt that can never fit: before queuing
        engine.generate(long)
    assert f"kv_bytes={5 * page_bytes + 1}: 5 pages of 16 tokens" in str(e.value)
    assert engine.ctx.pool.touched_pages == 0


def test_kv_bytes_below_one_page_is_a_config_error(tiny: LoadedModel) -> None:
    with pytest.raises(ConfigError, match="holds no KV page"):
        Engine(tiny, EngineConfig(kv_bytes=100))


@pytest.mark.parametrize("config", [EngineConfig(kv_bytes=1 << 62), EngineConfig(kv_pages=1 << 50)])
def test_a_pool_larger_than_the_machines_memory_is_a_config_error(
    tiny: LoadedModel, config: EngineConfig
) -> None:
    """A pool its machine cannot hold is refused before any page is reserved, naming the
    setting, the pool's bytes and the machine's."""
    with pytest.raises(ConfigError, match="exceeds this machine's memory") as e:
        Engine(tiny, config)
    assert ("kv_bytes=" if config.kv_bytes else "kv_pages=") in str(e.value)


def test_the_pool_bound_is_the_machines_memory(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentcache.runtime.engine as engine_module

    page_bytes = Engine(tiny, EngineConfig(kv_pages=1)).pool_config.page_bytes
    monkeypatch.setattr(engine_module, "machine_memory_bytes", lambda: 8 * page_bytes)
    assert Engine(tiny, EngineConfig(kv_pages=8)).ctx.pool.config.num_pages == 8
    with pytest.raises(ConfigError, match=f"{9 * page_bytes} bytes"):
        Engine(tiny, EngineConfig(kv_pages=9))
    monkeypatch.setattr(engine_module, "machine_memory_bytes", lambda: None)  # OS did not say
    assert Engine(tiny, EngineConfig(kv_pages=9)).ctx.pool.config.num_pages == 9
