"""`ReferenceConnector`: the smallest KV connector that shares prefix KV between vLLM engines,
kept next to `AgentCacheConnector` as the reference its prefix mode is checked against
(tests/engines/test_vllm_reference.py), as vLLM keeps simple example connectors.

Block b of a prompt (tokens [b*bs, (b+1)*bs)) is stored in `<store_dir>/reference/<h>.pt`,
h the SHA-256 of every token id up to the block's end, so a file matches only the very same
prefix. No index, no eviction, no checksums, no segments:

    scheduler  claims the stored blocks after vLLM's own hit, ending before the last prompt
               token; remembers the claim until vLLM allocates it
    worker     loads claimed blocks before the forward pass; after it, a request whose prompt
               completed in that step saves every full block not stored yet

Load it with KVTransferConfig(kv_connector="ReferenceConnector",
kv_connector_module_path="agentcache.engines.vllm.reference", kv_role="kv_both",
kv_connector_extra_config={"store_dir": DIR}). A prompt prefilled over several steps
(chunked prefill) is not saved.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
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
)

from agentcache.engines.vllm.connector import paged_kv  # noqa: E402
from agentcache.engines.vllm.identity import model_identity  # noqa: E402
from agentcache.engines.vllm.transfer import PagedKV  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass(frozen=True)
class BlockWork:
    token_ids: list[int]
    block_ids: list[int]
    load: tuple[int, int] | None  # claimed tokens, whole blocks
    save: bool


@dataclass
class ReferenceMetadata(KVConnectorMetadata):
    work: list[BlockWork] = field(default_factory=list)


class ReferenceConnector(KVConnectorBase_V1):
    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        assert vllm_config.kv_transfer_config is not None
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.folder = Path(extra["store_dir"]) / "reference"
        self.block_size = int(vllm_config.cache_config.block_size)
        # scheduler side: request -> (prompt, vLLM's hit, claimed tokens, allocated)
        self._claims: dict[str, tuple[list[int], int, int, bool]] = {}
        self._paged: PagedKV | None = None  # worker side

    def block_file(self, token_ids: Sequence[int], end: int) -> Path:
        """Where the block ending at token `end` of this prefix is stored."""
        digest = hashlib.sha256(json.dumps(list(token_ids[:end])).encode()).hexdigest()
        return self.folder / f"{digest}.pt"

    # ---------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        ids, bs = list(request.prompt_token_ids or []), self.block_size
        end = 0
        while end + bs < len(ids) and self.block_file(ids, end + bs).exists():
            end += bs
        claimed = max(0, end - num_computed_tokens)
        self._claims[request.request_id] = (ids, num_computed_tokens, claimed, False)
        return claimed, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        ids, start, claimed, _ = self._claims[request.request_id]
        assert num_external_tokens in (0, claimed), "vLLM allocated part of a claim"
        self._claims[request.request_id] = (ids, start, claimed, num_external_tokens > 0)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        so, meta = scheduler_output, ReferenceMetadata()
        for new in so.scheduled_new_reqs:
            ids = list(new.prompt_token_ids or [])
            done = new.num_computed_tokens + so.num_scheduled_tokens[new.req_id] >= len(ids)
            meta.work.append(BlockWork(ids, list(new.block_ids[0]), self._load(new.req_id), done))
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):  # a preempted request back: load again
            load, blocks = self._load(req_id), cached.new_block_ids[i]
            if load is not None and req_id in cached.resumed_req_ids and blocks is not None:
                ids = self._claims[req_id][0]
                meta.work.append(BlockWork(ids, list(blocks[0]), load, False))
        return meta

    def _load(self, req_id: str) -> tuple[int, int] | None:
        """The claim vLLM allocated, once (None: nothing to load)."""
        ids, start, claimed, allocated = self._claims.get(req_id, ([], 0, 0, False))
        if not allocated:
            return None
        self._claims[req_id] = (ids, start, claimed, False)
        return start, start + claimed

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        _, _, claimed, _ = self._claims.pop(request.request_id, ([], 0, 0, False))
        return False, {"reference": {"claimed_tokens": claimed}}

    # ---------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        num_layers = model_identity(Path(self._vllm_config.model_config.model)).num_layers
        self._paged = paged_kv(self._vllm_config, self._kv_cache_config, kv_caches, num_layers)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta, paged, bs = self._get_connector_metadata(), self._paged, self.block_size
        assert isinstance(meta, ReferenceMetadata) and paged is not None
        for w in meta.work:
            if w.load is None:
                continue
            for b in range(w.load[0] // bs, w.load[1] // bs):
                keys, values = torch.load(self.block_file(w.token_ids, (b + 1) * bs))
                paged.write(w.block_ids, b * bs, (b + 1) * bs, keys, values)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # start_load_kv is synchronous

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None  # saved whole in wait_for_save

    def wait_for_save(self) -> None:
        meta, paged, bs = self._get_connector_metadata(), self._paged, self.block_size
        assert isinstance(meta, ReferenceMetadata) and paged is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        for w in meta.work:
            for b in range(len(w.token_ids) // bs if w.save else 0):
                path = self.block_file(w.token_ids, (b + 1) * bs)
                if not path.exists():
                    keys, values = paged.read(w.block_ids, b * bs, (b + 1) * bs)
                    fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
                    with os.fdopen(fd, "wb") as f:
                        torch.save((keys, values), f)
                    os.replace(tmp, path)  # whole or absent: another engine may be loading
