"""Settings of the connector and of `VLLMBackend`, and the vLLM arguments that load the
connector. No vLLM import here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentcache.fieldtypes import check_field_types
from agentcache.model.loading import default_cache_dir
from agentcache.reuse import DEFAULT_STRATEGY, StrategySpec
from agentcache.units import GiB

CONNECTOR_CLASS = "AgentCacheConnector"
CONNECTOR_MODULE = "agentcache.engines.vllm.connector"
# what a VLLMBackend reuses: vLLM's prefix cache + the connector, the prefix cache alone, nothing
REUSE_MODES = ("agentcache", "prefix", "none")
# who computes the tokens of a segment request that reuse cannot supply: vLLM, in a staged
# prefill (positional strategies: stages.py); agentcache's engine inside the worker (the
# filler, any strategy); or, with auto, vLLM where the strategy allows it
FILL_MODES = ("auto", "vllm", "engine")


@dataclass(frozen=True)
class ConnectorSettings:
    """What the connector reads from `kv_connector_extra_config`.

    store_dir: the shared segment folder (every engine that should share KV points here);
    folder_bytes: the bound the folder is evicted to, least recently used first;
    store_bytes: the in-memory tier in front of it; segments: serve segment spans with a reuse
    strategy (False: exact prefix blocks only); strategy: the default one for segment requests;
    model_name: the name model ids are built from (the folder's name by default);
    fill: who computes a segment request's other tokens (FILL_MODES): with "vllm" the
    connector never runs agentcache's engine (no second copy of the weights), so it needs
    no float32 and serves segment spans through staged prefills only;
    scope_key: the secret segment scopes are signed with by whoever issues them (the
    backend makes one per engine); empty: requests' scopes are refused (`request.py`).
    """

    store_dir: str = str(default_cache_dir() / "vllm-store")
    store_bytes: int = 2 * GiB
    folder_bytes: int = 16 * GiB
    segments: bool = True
    strategy: str = DEFAULT_STRATEGY
    model_name: str | None = None
    # claim a span only when stored segments cover this share of it: the filler computes
    # the rest on agentcache's engine, slower per token than vLLM's kernels (docs/vllm.md)
    min_reused_fraction: float = 0.5
    fill: str = "auto"
    scope_key: str = ""

    def __post_init__(self) -> None:
        check_field_types(self)  # plain fields by their declared types
        StrategySpec.parse(self.strategy)  # unknown names list the known ones
        if self.fill not in FILL_MODES:
            raise ValueError(f"fill must be one of {FILL_MODES}, got {self.fill!r}")
        if not 0.0 <= self.min_reused_fraction <= 1.0:
            raise ValueError("min_reused_fraction must be in [0, 1]")
        if self.store_bytes < 0 or self.folder_bytes < 0:
            raise ValueError("store_bytes and folder_bytes must be >= 0")

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> ConnectorSettings:
        body = dict((extra or {}).get("agentcache", {}))
        known = set(cls.__dataclass_fields__)
        if unknown := set(body) - known:
            raise ValueError(f"unknown agentcache connector settings {sorted(unknown)}; "
                             f"known: {sorted(known)}")  # fmt: skip
        return cls(**body)

    def to_extra(self) -> dict[str, Any]:
        return {"agentcache": asdict(self)}


@dataclass(frozen=True)
class VLLMConfig:
    model: str | None = None  # model folder; None: the embedded default, converted once
    reuse: str = "agentcache"
    strategy: str = DEFAULT_STRATEGY
    min_reused_fraction: float = 0.5  # see ConnectorSettings
    store_dir: str | None = None  # shared segment folder (default ~/.cache/agentcache/vllm-store)
    store_bytes: int = 2 * GiB
    # the bound the shared folder is evicted to (ConnectorSettings.folder_bytes); the server's
    # retained share (pins across tool pauses) is a share of it
    folder_bytes: int = 16 * GiB
    kv_cache_bytes: int = 1 * GiB  # vLLM's own paged KV memory
    max_model_len: int = 8192
    max_num_seqs: int = 256  # requests vLLM runs at once (its CPU default for `LLM`)
    block_size: int = 32  # a multiple of 32 on CPU
    dtype: str = "float32"
    logprobs: int = 20  # top log-probabilities kept for `first_token_logits`
    # run vLLM's engine core in this process (no spawn): the environment must hold
    # VLLM_ENABLE_V1_MULTIPROCESSING=0 (IN_PROCESS_ENV), which agentcache's CLI sets
    in_process: bool = True
    # who computes what reuse cannot supply (config.FILL_MODES): "vllm" runs staged prefills
    # (stages.py: positional strategies only), "engine" agentcache's engine in the worker,
    # "auto" staged where the strategy allows it
    fill: str = "auto"
    min_stage_tokens: int = 64  # a reused run shorter than this is computed, not staged

    def __post_init__(self) -> None:
        check_field_types(self)  # plain fields by their declared types
        if self.reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {REUSE_MODES}, got {self.reuse!r}")
        if self.fill not in FILL_MODES:
            raise ValueError(f"fill must be one of {FILL_MODES}, got {self.fill!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.folder_bytes < 1:
            raise ValueError(f"folder_bytes must be >= 1, got {self.folder_bytes}")
        if self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be >= 1, got {self.kv_cache_bytes}")
        if self.min_stage_tokens < 1:
            raise ValueError(f"min_stage_tokens must be >= 1, got {self.min_stage_tokens}")
        spec = StrategySpec.parse(self.strategy)
        if self.reuse == "agentcache" and self.fill == "vllm":
            from agentcache.engines.vllm.stages import staged_strategy  # torch: when needed

            staged_strategy(spec)  # a clear error now for one that cannot be staged


def kv_transfer_config(settings: ConnectorSettings) -> Any:
    """vLLM's `KVTransferConfig` that loads agentcache's connector (imports vLLM)."""
    from agentcache.engines.vllm import require_vllm

    require_vllm()
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        kv_connector=CONNECTOR_CLASS,
        kv_connector_module_path=CONNECTOR_MODULE,
        kv_role="kv_both",
        kv_connector_extra_config=settings.to_extra(),
        kv_load_failure_policy="recompute",  # a block that fails its checksum is recomputed
    )


def default_model_folder(cache_dir: Path | None = None) -> Path:
    """The converted safetensors folder of the embedded default model (converted once)."""
    from agentcache.model.loading import convert_default_model

    return convert_default_model(cache_dir or default_cache_dir())
