"""`AgentCacheConnector`: a vLLM `KVConnectorBase_V1` backed by agentcache's segment store.

Load it with `agentcache.engines.vllm.config.kv_transfer_config(...)`, which fills
`KVTransferConfig(kv_connector="AgentCacheConnector",
kv_connector_module_path="agentcache.engines.vllm.connector", kv_role="kv_both", ...)`.

Scheduler side (one instance in the scheduler process):
    get_num_new_matched_tokens  chooses the request's transfer mode (modes.py) once, then
                                asks it: prefix: stored blocks after vLLM's own hit;
                                segments: the whole span up to the last prompt token if a
                                reusable segment in it is stored (plan.py); staged: the rest
                                of a stage's run of stored KV (stages.py)
    update_state_after_alloc    remembers the claimed span for the next step's metadata
    build_connector_meta        per request scheduled this step: span to load, and whether
                                its prefill completes this step (then its KV is saved)
    request_finished            returns what the connector did in kv_transfer_params
Worker side (one instance per worker):
    register_kv_caches          checks the layout (CPU / split-last) or refuses loudly
    start_load_kv               the request's mode loads its claimed span, synchronously
    wait_for_save               after the forward: the mode stores blocks / segments
The scheduler holds one `RequestState` per request; the worker one `RequestStats` per
request for the step, sent back in the worker metadata.
Loads are synchronous (the step waits for them); saves happen after the forward pass, before
the pages can be reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentcache.engines.vllm import check_version, installed_vllm_version

check_version(installed_vllm_version())  # before vLLM's API is touched: a clear start-up error

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)

from agentcache.engines.vllm import UnsupportedKVLayoutError  # noqa: E402
from agentcache.engines.vllm.config import ConnectorSettings  # noqa: E402
from agentcache.engines.vllm.families import require_folder_rerotation  # noqa: E402
from agentcache.engines.vllm.identity import model_identity, store_model_id  # noqa: E402
from agentcache.engines.vllm.layout import KVShape, layout_for  # noqa: E402
from agentcache.engines.vllm.modes import (  # noqa: E402
    Modes,
    PrefixMode,
    RequestWork,
    SegmentMode,
    StagedMode,
    StoreKeys,
)
from agentcache.engines.vllm.reports import RequestStats  # noqa: E402
from agentcache.engines.vllm.scheduler import ConnectorScheduler  # noqa: E402
from agentcache.engines.vllm.storage import FolderSegmentStore  # noqa: E402
from agentcache.engines.vllm.transfer import (  # noqa: E402
    PagedKV,
    PrefixTransfer,
    SegmentFiller,
    StoredRunLoader,
    layer_order,
)
from agentcache.engines.vllm.worker import ConnectorWorker  # noqa: E402
from agentcache.model.rope import RotaryEmbedding  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


@dataclass
class AgentCacheMetadata(KVConnectorMetadata):
    work: list[RequestWork] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)  # requests finished since the last step


@dataclass
class AgentCacheWorkerMetadata(KVConnectorWorkerMetadata):
    stats: dict[str, RequestStats] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, AgentCacheWorkerMetadata)
        merged = dict(self.stats)
        for req_id, s in other.stats.items():
            old = merged.get(req_id)
            merged[req_id] = s if old is None else old.merge(s)
        return AgentCacheWorkerMetadata(merged)


class AgentCacheConnector(KVConnectorBase_V1):
    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        assert vllm_config.kv_transfer_config is not None
        self.settings = ConnectorSettings.from_extra(
            vllm_config.kv_transfer_config.kv_connector_extra_config
        )
        self.block_size = int(vllm_config.cache_config.block_size)
        model_config = vllm_config.model_config
        self.model_folder = Path(model_config.model)
        if self.settings.segments:  # stored keys move to new positions: refuse what cannot
            require_folder_rerotation(self.model_folder)
        self.dtype: torch.dtype = model_config.dtype
        self.runs_engine = self.settings.segments and self.settings.fill != "vllm"
        if self.runs_engine and self.dtype != torch.float32:
            raise UnsupportedKVLayoutError(
                f"segment reuse with agentcache's engine runs it in float32; start vLLM with "
                f"dtype='float32' (got {self.dtype}), or set fill='vllm' (staged prefills, "
                "vLLM computes every token), or turn segment reuse off"
            )
        ident = model_identity(self.model_folder, self.settings.model_name)
        self.model_id = store_model_id(ident.model_id, self.dtype)
        self.tokenizer_id = ident.tokenizer_id
        self.num_layers = ident.num_layers
        self.store = FolderSegmentStore(
            Path(self.settings.store_dir),
            self.settings.store_bytes,
            folder_bytes=self.settings.folder_bytes,
        )
        keys = StoreKeys(self.store, self.model_id, self.tokenizer_id)
        filler = self._segment_filler if self.runs_engine else None
        self.modes = Modes(
            PrefixMode(
                PrefixTransfer(self.store, self.model_id, self.tokenizer_id), self.block_size
            ),
            SegmentMode(keys, self.settings.min_reused_fraction, filler),
            StagedMode(keys, self._run_loader),
            self.settings.segments,
        )
        self.scheduler = ConnectorScheduler(self.modes, self.settings.scope_key)
        self.worker = ConnectorWorker(self.modes, self.block_size, Path(self.settings.store_dir))
        self._filler: SegmentFiller | None = None
        self._runs: StoredRunLoader | None = None

    # ---------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.scheduler.claim(request, num_computed_tokens), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.scheduler.allocated(request.request_id, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        work = self.scheduler.work(scheduler_output)
        return AgentCacheMetadata(work, sorted(scheduler_output.finished_req_ids))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        worker = connector_output.kv_connector_worker_meta
        if isinstance(worker, AgentCacheWorkerMetadata):
            self.scheduler.worker_stats(worker.stats)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, self.scheduler.finished(request.request_id)

    # ---------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        paged = paged_kv(self._vllm_config, self._kv_cache_config, kv_caches, self.num_layers)
        self.worker.paged = paged
        if self.settings.segments:
            head_size = paged.layout.shape.head_size
            rope = self._rope(head_size)
            self._runs = StoredRunLoader(self.store, self.model_id, self.tokenizer_id, rope)
        if self.runs_engine:  # load the filler's weights now, not in a request's TTFT
            self._segment_filler()

    def _rope(self, head_dim: int) -> RotaryEmbedding:
        """The model's own rotary embedding (config only, no weights), for re-rotation."""
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(self.model_folder)
        max_len = int(self._vllm_config.model_config.max_model_len)
        return RotaryEmbedding.from_hf_config(hf_config, head_dim, max_len)

    def _segment_filler(self) -> SegmentFiller:
        if self._filler is None:
            from agentcache.model.loading import load_folder

            model = load_folder(self.model_folder, self.settings.model_name)
            if model.model_id != self.model_id:
                raise UnsupportedKVLayoutError(
                    f"agentcache loaded {model.model_id} from {self.model_folder} but the store "
                    f"keys are for {self.model_id}"
                )
            max_tokens = int(self._vllm_config.model_config.max_model_len)
            self._filler = SegmentFiller(model, self.store, max_tokens, self.settings.strategy)
        return self._filler

    def _run_loader(self) -> StoredRunLoader:
        assert self._runs is not None, "register_kv_caches was not called"
        return self._runs

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentCacheMetadata)
        self.worker.load(meta.work, meta.finished)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # start_load_kv is synchronous

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None  # saved whole in wait_for_save, once the prompt's KV is complete

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentCacheMetadata)
        self.worker.save(meta.work)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.load_errors()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        stats = self.worker.step_stats()
        return AgentCacheWorkerMetadata(stats) if stats else None


def paged_kv(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig | None,
    kv_caches: dict[str, torch.Tensor],
    num_layers: int,
) -> PagedKV:
    """vLLM's registered KV caches in layer order, seen through their layout (layout.py);
    anything the connectors cannot read exactly is an `UnsupportedKVLayoutError`."""
    names = layer_order(list(kv_caches))
    if len(names) != num_layers:
        raise UnsupportedKVLayoutError(
            f"vLLM registered {len(names)} KV caches for a {num_layers}-layer model; "
            "the connector needs one full-attention cache per layer"
        )
    groups = kv_cache_config.kv_cache_groups if kv_cache_config else []
    if len(groups) != 1:
        raise UnsupportedKVLayoutError(
            f"{len(groups)} KV cache groups (hybrid or sliding-window model); the connector "
            "supports one full-attention group"
        )
    spec = groups[0].kv_cache_spec
    if type(spec).__name__ == "SlidingWindowSpec":  # its blocks outside the window are freed
        raise UnsupportedKVLayoutError(
            "a sliding-window KV cache group (every layer slides); the connector reads and "
            "writes whole prompts, so it supports one full-attention group"
        )
    layer = vllm_config.compilation_config.static_forward_context[names[0]]
    backend = layer.attn_backend.get_name()
    block_size = int(vllm_config.cache_config.block_size)
    shape = KVShape(int(spec.num_kv_heads), int(spec.head_size), block_size)
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    isa = getattr(layer, "isa", None)
    if backend == "CPU_ATTN" and isa is None:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        dtype = vllm_config.model_config.dtype
        isa = _get_attn_isa(dtype, block_size, shape.head_size, cache_dtype)
    head_size_v = int(getattr(spec, "head_size_v", spec.head_size))
    layout = layout_for(backend, shape, head_size_v, cache_dtype, cpu_isa=isa)
    return PagedKV([kv_caches[n] for n in names], layout)
