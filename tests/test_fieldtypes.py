"""Every configuration dataclass checks its plain fields' types when made (agentcache/
fieldtypes.py): from Python, a value of another type is an error naming the field, before
any engine, store or server is built on it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from agentcache.decode.config import DecodeConfig
from agentcache.engines.vllm.config import ConnectorSettings, VLLMConfig
from agentcache.errors import ConfigError
from agentcache.fieldtypes import PLAIN, check_field_types
from agentcache.runtime.config import EngineConfig
from agentcache.server import ServerConfig, ServerLimits
from agentcache.tiers.config import TierConfig

CASES: list[tuple[type, dict[str, Any], str]] = [
    (DecodeConfig, {"budget_pages": "8"}, "budget_pages must be a whole number, got '8'"),
    (DecodeConfig, {"verify": None}, "verify must be a whole number, got None"),
    (DecodeConfig, {"top_p": float("nan")}, "top_p must be a number, got nan"),
    (TierConfig, {"host_bytes": None}, "host_bytes must be a whole number, got None"),
    (TierConfig, {"fsync": "no"}, "fsync must be True or False, got 'no'"),
    (TierConfig, {"retain_share": True}, "retain_share must be a number, got True"),
    (TierConfig, {"journal_compact_lines": -1}, "journal_compact_lines must be >= 1, got -1"),
    (TierConfig, {"disk_dir": 5}, "disk_dir must be a folder's path or None, got 5"),
    (TierConfig, {"disk_dir": ""}, "disk_dir must be a folder's path or None, got ''"),
    (ServerConfig, {"request_timeout_s": None}, "request_timeout_s must be a number, got None"),
    (ServerConfig, {"max_queued": "8"}, "max_queued must be a whole number, got '8'"),
    (ServerConfig, {"enable_docs": 1}, "enable_docs must be True or False, got 1"),
    (ServerConfig, {"conversation_secret": "s"}, "conversation_secret must be bytes or None"),
    (ServerConfig, {"api_key_digests": ["a"]}, "api_key_digests must be a frozenset of strings"),
    (ServerConfig, {"limits": {}}, "limits must be a ServerLimits, got {}"),
    (ServerConfig, {"stored_response_ttl_s": 0}, "stored_response_ttl_s > 0"),
    (ServerLimits, {"max_depth": "32"}, "max_depth must be an integer >= 1, got '32'"),
    (EngineConfig, {"kv_pages": None}, "kv_pages must be a whole number, got None"),
    (ConnectorSettings, {"segments": "yes"}, "segments must be True or False, got 'yes'"),
    (ConnectorSettings, {"min_reused_fraction": float("nan")}, "min_reused_fraction must be"),
    (ConnectorSettings, {"store_dir": None}, "store_dir must be a string, got None"),
    (VLLMConfig, {"max_num_seqs": "8"}, "max_num_seqs must be a whole number, got '8'"),
    (VLLMConfig, {"in_process": 1}, "in_process must be True or False, got 1"),
]
REQUIRED: dict[type, dict[str, Any]] = {ServerConfig: {"model_name": "m"}}


@pytest.mark.parametrize(("cls", "fields", "needle"), CASES,
                         ids=[f"{c.__name__}-{next(iter(f))}" for c, f, _ in CASES])  # fmt: skip
def test_a_field_of_another_type_is_named(
    cls: type, fields: dict[str, Any], needle: str
) -> None:  # fmt: skip
    with pytest.raises(ValueError) as e:  # ConfigError, or the class's own ValueError
        cls(**REQUIRED.get(cls, {}), **fields)
    assert needle in str(e.value)


def test_the_defaults_pass_and_a_str_path_is_kept_a_path() -> None:
    for cls in (DecodeConfig, TierConfig, ServerLimits, EngineConfig, ConnectorSettings,
                VLLMConfig):  # fmt: skip
        check_field_types(cls())
    check_field_types(ServerConfig("m"))
    assert TierConfig(disk_dir="kv") == TierConfig(disk_dir=Path("kv"))  # type: ignore[arg-type]


def test_every_plain_annotation_of_the_configs_is_known() -> None:
    """A new field whose annotation the table lacks would go unchecked: each config's plain
    fields are in PLAIN, the rest checked by the class (paths, nested configs, options)."""
    others = {"Path | None", "ServerLimits", "DecodeConfig", "TierConfig | None",
              "dict[str, Any]", "dict[str, dict[str, Any]]"}  # fmt: skip
    for cls in (DecodeConfig, TierConfig, ServerLimits, ServerConfig, EngineConfig,
                ConnectorSettings, VLLMConfig):  # fmt: skip
        for f in dataclasses.fields(cls):
            assert str(f.type) in PLAIN or str(f.type) in others, (cls.__name__, f.name, f.type)


def test_a_bool_is_no_number_and_nan_is_none() -> None:
    with pytest.raises(ConfigError, match="retain_share must be a number, got nan"):
        TierConfig(retain_share=float("nan"))
    with pytest.raises(ConfigError, match="page_size must be a whole number, got False"):
        TierConfig(page_size=False)
