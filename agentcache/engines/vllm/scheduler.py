"""The connector's scheduler side: one `RequestState` per request, from its first claim to
its end (vLLM's types only in annotations, so it is tested without vLLM).

    claim       reads the request's spec and chooses its mode once, then asks the mode
    allocated   remembers the span vLLM allocated for the claim, loaded in the next step
    work        per request scheduled this step: span to load, and whether its prefill
                completes this step (then its KV is saved)
    finished    the request's `SchedulerReport`, returned in its kv_transfer_params
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentcache.engines.vllm.modes import Claim, Modes, RequestWork, TransferMode
from agentcache.engines.vllm.reports import MissRow, RequestStats, SchedulerReport
from agentcache.engines.vllm.request import RequestSpec
from agentcache.errors import PromptError

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


@dataclass
class RequestState:
    """What the scheduler holds of one request."""

    spec: RequestSpec
    mode: TransferMode
    rejected: str | None = None  # why its segment spec was refused (served as prefix)
    claim: tuple[int, int] = (0, 0)  # [vLLM's hit, end of the connector's claim)
    to_load: tuple[int, int] | None = None  # allocated: loaded in the next step
    declined: str | None = None  # why its run or span was left to vLLM
    unclaimed: tuple[list[MissRow], str | None] | None = None  # segments mode, see Claim
    token_ids: list[int] = field(default_factory=list)  # once scheduled
    block_ids: list[int] = field(default_factory=list)
    saved: bool = False
    worker: RequestStats | None = None  # the worker stats that reached the scheduler
    preemptions: int = 0  # times vLLM's scheduler preempted it (its blocks freed)

    def record(self, claim: Claim, num_computed: int) -> None:
        self.claim = (num_computed, num_computed + claim.num_tokens)
        self.declined = claim.declined if claim.declined is not None else self.declined
        self.unclaimed = claim.unclaimed

    def report(self) -> SchedulerReport:
        start, end = self.claim
        misses, declined = self.unclaimed or ([], None)
        found = (self.rejected, declined, self.declined)
        return SchedulerReport(
            self.spec.mode, start, end - start, self.worker,
            tuple(misses), tuple(r for r in found if r is not None), self.preemptions,
        )  # fmt: skip


class ConnectorScheduler:
    def __init__(self, modes: Modes, scope_key: str) -> None:
        self.modes = modes
        self.scope_key = scope_key
        self._requests: dict[str, RequestState] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def _state(self, request: Request) -> RequestState:
        state = self._requests.get(request.request_id)
        if state is None:
            params = getattr(request, "kv_transfer_params", None)
            rejected = None
            try:
                num_tokens = len(request.prompt_token_ids or [])
                spec = RequestSpec.parse(params, num_tokens, self.scope_key)
            except PromptError as e:  # one bad request must not stop the engine: prefix mode
                logger.warning("agentcache: request %s: %s; exact prefix reuse only",
                               request.request_id, e)  # fmt: skip
                rejected, spec = str(e), RequestSpec()
            state = RequestState(spec, self.modes.choose(spec), rejected)
            self._requests[request.request_id] = state
        return state

    def claim(self, request: Request, num_computed: int) -> int:
        """Tokens after vLLM's hit of `num_computed` the connector fills."""
        state = self._state(request)
        claim = state.mode.claim(state.spec, list(request.prompt_token_ids or []), num_computed)
        state.record(claim, num_computed)
        return claim.num_tokens

    def allocated(self, req_id: str, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            state = self._requests[req_id]
            start = state.claim[0]
            state.to_load = (start, start + num_external_tokens)

    def work(self, so: SchedulerOutput) -> list[RequestWork]:
        """This step's transfers; counts the requests vLLM preempted since the last step
        (`SchedulerOutput.preempted_req_ids`: each preemption is in one step's output)."""
        for req_id in getattr(so, "preempted_req_ids", None) or ():
            if (preempted := self._requests.get(req_id)) is not None:
                preempted.preemptions += 1
        out: list[RequestWork] = []
        for new in so.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is None:  # not seen by get_num_new_matched_tokens: exact prefix only
                state = self._requests[new.req_id] = RequestState(RequestSpec(), self.modes.prefix)
            state.token_ids = list(new.prompt_token_ids or [])
            state.block_ids = list(new.block_ids[0])
            state.saved = False
            self._add_work(out, new.req_id, state, new.num_computed_tokens, so)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state_or_none = self._requests.get(req_id)
            if state_or_none is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if new_blocks is not None:
                if req_id in cached.resumed_req_ids:
                    state_or_none.block_ids = list(new_blocks[0])
                else:
                    state_or_none.block_ids += list(new_blocks[0])
            self._add_work(out, req_id, state_or_none, cached.num_computed_tokens[i], so)
        return out

    def _add_work(
        self,
        out: list[RequestWork],
        req_id: str,
        state: RequestState,
        num_computed: int,
        so: SchedulerOutput,
    ) -> None:
        load, state.to_load = state.to_load, None
        scheduled = so.num_scheduled_tokens.get(req_id, 0)
        prompt_len = len(state.token_ids)
        save = not state.saved and num_computed + scheduled >= prompt_len and prompt_len > 0
        # a claimed span counts as computed before the step's forward pass
        if load is not None:
            save = not state.saved and load[1] + scheduled >= prompt_len
        save = save and state.spec.save  # a staged prefill stores at its last stage only
        if load is None and not save:
            return
        state.saved = state.saved or save
        out.append(RequestWork(
            req_id, state.mode.name, state.token_ids, list(state.block_ids), state.spec, load, save
        ))  # fmt: skip

    def worker_stats(self, stats: Mapping[str, RequestStats]) -> None:
        """Add the workers' stats of a step to their requests'."""
        for req_id, s in stats.items():
            state = self._requests.get(req_id)  # a finished request's last word: its report
            if state is not None:
                state.worker = s if state.worker is None else state.worker.merge(s)

    def finished(self, req_id: str) -> dict[str, Any]:
        """The request's kv_transfer_params; its state is dropped."""
        state = self._requests.pop(req_id, None)
        if state is None:
            state = RequestState(RequestSpec(), self.modes.prefix)
        return state.report().as_params()
