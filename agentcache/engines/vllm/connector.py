"""`AgentCacheConnector`: a vLLM `KVConnectorBase_V1` backed by agentcache's segment store.

Load it with `agentcache.engines.vllm.config.kv_transfer_config(...)`, which fills
`KVTransferConfig(kv_connector="AgentCacheConnector",
kv_connector_module_path="agentcache.engines.vllm.connector", kv_role="kv_both", ...)`.

Scheduler side (one instance in the scheduler process):
    get_num_new_matched_tokens  prefix mode: stored blocks after vLLM's own hit; segment mode:
                                the whole span up to the last prompt token if a reusable
                                segment in it is stored (plan.py); a stage of a staged
                                prefill: the rest of its run of stored KV (stages.py)
    update_state_after_alloc    remembers the claimed span for the next step's metadata
    build_connector_meta        per request scheduled this step: span to load, and whether
                                its prefill completes this step (then its KV is saved)
    request_finished            returns what the connector did in kv_transfer_params
Worker side (one instance per worker):
    register_kv_caches          checks the layout (CPU / split-last) or refuses loudly
    start_load_kv               loads prefix blocks or a staged run's stored KV, or runs the
                                segment filler, synchronously
    wait_for_save               after the forward: stores blocks / segments from the pages
Loads are synchronous (the step waits for them); saves happen after the forward pass, before
the pages can be reused.
"""

from __future__ import annotations

import logging
import time
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
from agentcache.engines.vllm.identity import model_identity, store_model_id  # noqa: E402
from agentcache.engines.vllm.layout import KVShape, layout_for  # noqa: E402
from agentcache.engines.vllm.plan import (  # noqa: E402
    claim_prefix,
    claim_segments,
    claim_stage,
    unclaimed_segments,
)
from agentcache.engines.vllm.reports import ReportBook, merge_counts  # noqa: E402
from agentcache.engines.vllm.request import RequestSpec  # noqa: E402
from agentcache.engines.vllm.storage import FolderSegmentStore  # noqa: E402
from agentcache.engines.vllm.transfer import (  # noqa: E402
    PagedKV,
    PrefixTransfer,
    RequestStats,
    SegmentFiller,
    StoredRunLoader,
    layer_order,
    save_segments,
)
from agentcache.errors import AgentCacheError, PromptError  # noqa: E402
from agentcache.model.rope import RotaryEmbedding  # noqa: E402

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


@dataclass
class RequestWork:
    req_id: str
    token_ids: list[int]
    block_ids: list[int]
    spec: RequestSpec
    load: tuple[int, int] | None  # token span to fill this step
    save: bool  # the prompt's prefill completes this step


@dataclass
class AgentCacheMetadata(KVConnectorMetadata):
    work: list[RequestWork] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)  # requests finished since the last step


@dataclass
class AgentCacheWorkerMetadata(KVConnectorWorkerMetadata):
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, AgentCacheWorkerMetadata)
        merged = {k: dict(v) for k, v in self.stats.items()}
        for req_id, s in other.stats.items():
            merge_counts(merged.setdefault(req_id, {}), s)
        return AgentCacheWorkerMetadata(merged)


@dataclass
class _Live:
    token_ids: list[int]
    block_ids: list[int]
    spec: RequestSpec
    saved: bool = False


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
        self.prefix = PrefixTransfer(self.store, self.model_id, self.tokenizer_id)
        # scheduler side
        self._specs: dict[str, RequestSpec] = {}
        self._claims: dict[str, tuple[int, int]] = {}
        self._to_load: dict[str, tuple[int, int]] = {}
        self._live: dict[str, _Live] = {}
        self._finished_stats: dict[str, dict[str, Any]] = {}
        self._rejected: dict[str, str] = {}  # request -> why its segment spec was refused
        # request -> (segments vLLM computed though reusable, why), when nothing was claimed
        self._unclaimed: dict[str, tuple[list[list[Any]], str | None]] = {}
        # request -> why its staged run was not claimed
        self._stage_declined: dict[str, str] = {}
        # worker side
        self._paged: PagedKV | None = None
        self._filler: SegmentFiller | None = None
        self._runs: StoredRunLoader | None = None
        self._step_stats: dict[str, RequestStats] = {}
        self._failed_blocks: set[int] = set()
        self._reports = ReportBook(Path(self.settings.store_dir))

    # ---------------------------------------------------------------- scheduler side

    def _spec(self, request: Request) -> RequestSpec:
        spec = self._specs.get(request.request_id)
        if spec is None:
            params = getattr(request, "kv_transfer_params", None)
            try:
                num_tokens = len(request.prompt_token_ids or [])
                spec = RequestSpec.parse(params, num_tokens, self.settings.scope_key)
            except PromptError as e:  # one bad request must not stop the engine: prefix mode
                logger.warning("agentcache: request %s: %s; exact prefix reuse only",
                               request.request_id, e)  # fmt: skip
                self._rejected[request.request_id] = str(e)
                spec = RequestSpec()
            self._specs[request.request_id] = spec
        return spec

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        ids = list(request.prompt_token_ids or [])
        spec = self._spec(request)

        def present(cid: str) -> bool:
            return self.store.contains_content(self.model_id, self.tokenizer_id, cid)

        if spec.mode == "staged" and self.settings.segments:
            n, declined = claim_stage(spec, ids, num_computed_tokens, present)
            if declined is not None:
                self._stage_declined[request.request_id] = declined
        elif spec.mode == "segments" and self.settings.segments and not self.runs_engine:
            n = 0  # nothing here computes the span's other tokens: vLLM computes it all
            self._stage_declined[request.request_id] = (
                "the connector runs with fill='vllm' and serves segment spans through staged "
                "prefills only (VLLMBackend sends them): vLLM computed the span"
            )
        elif spec.mode == "segments" and self.settings.segments:
            floor = (
                self.settings.min_reused_fraction if spec.min_reused is None else spec.min_reused
            )
            n = claim_segments(spec, ids, num_computed_tokens, present, floor)
            if n == 0:  # vLLM computes the segments after its own hit: say why
                self._unclaimed[request.request_id] = unclaimed_segments(
                    spec, ids, num_computed_tokens, present
                )
            else:
                self._unclaimed.pop(request.request_id, None)
        else:
            n = claim_prefix(ids, self.block_size, num_computed_tokens, self.prefix.present)
        self._claims[request.request_id] = (num_computed_tokens, num_computed_tokens + n)
        return n, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens > 0:
            start, _ = self._claims[request.request_id]
            self._to_load[request.request_id] = (start, start + num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        so = scheduler_output
        meta = AgentCacheMetadata(finished=sorted(so.finished_req_ids))
        for new in so.scheduled_new_reqs:
            spec = self._specs.get(new.req_id, RequestSpec())
            live = _Live(list(new.prompt_token_ids or []), list(new.block_ids[0]), spec)
            self._live[new.req_id] = live
            self._add_work(meta, new.req_id, live, new.num_computed_tokens, so)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            live_or_none = self._live.get(req_id)
            if live_or_none is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if new_blocks is not None:
                if req_id in cached.resumed_req_ids:
                    live_or_none.block_ids = list(new_blocks[0])
                else:
                    live_or_none.block_ids += list(new_blocks[0])
            self._add_work(meta, req_id, live_or_none, cached.num_computed_tokens[i], so)
        return meta

    def _add_work(
        self,
        meta: AgentCacheMetadata,
        req_id: str,
        live: _Live,
        num_computed: int,
        so: SchedulerOutput,
    ) -> None:
        load = self._to_load.pop(req_id, None)
        scheduled = so.num_scheduled_tokens.get(req_id, 0)
        prompt_len = len(live.token_ids)
        save = not live.saved and num_computed + scheduled >= prompt_len and prompt_len > 0
        # a claimed span counts as computed before the step's forward pass
        if load is not None:
            save = not live.saved and load[1] + scheduled >= prompt_len
        save = save and live.spec.save  # a staged prefill stores at its last stage only
        if load is None and not save:
            return
        live.saved = live.saved or save
        spec = live.spec if self.settings.segments else RequestSpec(report=live.spec.report)
        meta.work.append(
            RequestWork(req_id, live.token_ids, list(live.block_ids), spec, load, save)
        )

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        worker = connector_output.kv_connector_worker_meta
        if isinstance(worker, AgentCacheWorkerMetadata):
            for req_id, s in worker.stats.items():
                if req_id in self._specs:  # a finished request's last word is in its report
                    merge_counts(self._finished_stats.setdefault(req_id, {}), s)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        req_id = request.request_id
        self._live.pop(req_id, None)
        spec = self._specs.pop(req_id, RequestSpec())
        start, end = self._claims.pop(req_id, (0, 0))
        self._to_load.pop(req_id, None)
        stats: dict[str, Any] = {"mode": spec.mode, "vllm_cached_tokens": start}
        stats["planned_tokens"] = end - start
        stats |= self._finished_stats.pop(req_id, {})
        # the scheduler's own findings, under keys of their own: the worker's report file
        # (merged over these by VLLMBackend) carries the worker's misses and fallbacks
        misses, declined = self._unclaimed.pop(req_id, ([], None))
        found = (self._rejected.pop(req_id, None), declined, self._stage_declined.pop(req_id, None))
        reasons = [r for r in found if r is not None]
        stats["scheduler_misses"] = misses
        stats["scheduler_fallback_reasons"] = reasons
        return False, {"agentcache": stats}

    # ---------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = layer_order(list(kv_caches))
        if len(names) != self.num_layers:
            raise UnsupportedKVLayoutError(
                f"vLLM registered {len(names)} KV caches for a {self.num_layers}-layer model; "
                "the connector needs one full-attention cache per layer"
            )
        groups = self._kv_cache_config.kv_cache_groups if self._kv_cache_config else []
        if len(groups) != 1:
            raise UnsupportedKVLayoutError(
                f"{len(groups)} KV cache groups (hybrid or sliding-window model); the connector "
                "supports one full-attention group"
            )
        spec = groups[0].kv_cache_spec
        static = self._vllm_config.compilation_config.static_forward_context
        layer = static[names[0]]
        backend = layer.attn_backend.get_name()
        shape = KVShape(int(spec.num_kv_heads), int(spec.head_size), self.block_size)
        cache_dtype = str(self._vllm_config.cache_config.cache_dtype)
        isa = getattr(layer, "isa", None)
        if backend == "CPU_ATTN" and isa is None:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            isa = _get_attn_isa(self.dtype, self.block_size, shape.head_size, cache_dtype)
        layout = layout_for(
            backend,
            shape,
            int(getattr(spec, "head_size_v", spec.head_size)),
            cache_dtype,
            cpu_isa=isa,
        )
        self._paged = PagedKV([kv_caches[n] for n in names], layout)
        if self.settings.segments:
            self._runs = StoredRunLoader(
                self.store, self.model_id, self.tokenizer_id, self._rope(shape.head_size)
            )
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

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentCacheMetadata)
        self._reports.forget(meta.finished)
        for work in meta.work:
            if work.spec.report:
                self._reports.remember(work.req_id, work.spec.report)
            if work.load is None:
                continue
            stats = self._step_stats.setdefault(work.req_id, RequestStats(work.spec.mode))
            stats.claimed_tokens += work.load[1] - work.load[0]
            t0 = time.perf_counter()
            try:
                self._load(work, stats)
            except AgentCacheError as e:  # vLLM recomputes the span: one request's problem
                logger.warning("agentcache: request %s: %s; vLLM recomputes it", work.req_id, e)
                stats.fallbacks += 1
                stats.fallback_reasons.append(f"fill failed ({e}): vLLM recomputed the span")
                self._failed_blocks.update(self._blocks_of(work))
            stats.fill_ms += (time.perf_counter() - t0) * 1e3

    def _blocks_of(self, work: RequestWork) -> list[int]:
        assert work.load is not None
        start, end = work.load
        bs = self.block_size
        return work.block_ids[start // bs : -(-end // bs)]

    def _load(self, work: RequestWork, stats: RequestStats) -> None:
        paged = self._paged
        assert paged is not None and work.load is not None, "register_kv_caches was not called"
        start, end = work.load
        if work.spec.mode == "staged":
            assert self._runs is not None
            run = self._runs.fill(paged, work.spec, work.token_ids, work.block_ids, start, end)
            stats.reused_tokens += run.reused_tokens
            stats.load_failures += len(run.failed_blocks)
            stats.misses += run.misses
            self._failed_blocks.update(run.failed_blocks)
        elif work.spec.mode == "segments":
            rs = self._segment_filler().fill(
                paged, work.spec, work.token_ids, work.block_ids, start, end
            )
            stats.reused_tokens += rs.reused_tokens
            stats.computed_tokens += rs.recomputed_tokens
            stats.fallbacks += rs.fallbacks
            stats.fallback_reasons += rs.fallback_reasons
            stats.misses += [[m.segment_id, str(m.kind), m.num_tokens, str(m.reason)]
                             for m in rs.misses]  # fmt: skip
        else:
            failed = self.prefix.load(paged, work.token_ids, work.block_ids, start, end)
            stats.reused_tokens += end - start - len(failed) * self.block_size
            stats.load_failures += len(failed)
            self._failed_blocks.update(failed)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # start_load_kv is synchronous

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None  # saved whole in wait_for_save, once the prompt's KV is complete

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentCacheMetadata)
        paged = self._paged
        for work in meta.work:
            if not work.save or paged is None:
                continue
            stats = self._step_stats.setdefault(work.req_id, RequestStats(work.spec.mode))
            if work.spec.mode in ("segments", "staged"):
                stats.stored_entries += save_segments(
                    self.store, self.model_id, self.tokenizer_id, paged, work.spec,
                    work.token_ids, work.block_ids,
                )  # fmt: skip
            else:
                stats.stored_entries += self.prefix.save(paged, work.token_ids, work.block_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if not self._step_stats:
            return None
        stats = {k: v.as_dict() for k, v in self._step_stats.items()}
        self._step_stats = {}
        for req_id, s in stats.items():  # vLLM finishes a request before the worker's last word
            self._reports.write(req_id, s)
        return AgentCacheWorkerMetadata(stats)
