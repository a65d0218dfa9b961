"""Log-probabilities of a reply's tokens (OpenAI `logprobs` / `top_logprobs`), read from each
decode step's logits through the runtime's constraint seam (`TokenConstraint`): the recorder
allows every token the inner constraint (a grammar, if any) allows, and keeps the step's
log-softmax until the next step's ids say which token was chosen.

    step i: allowed(ids[:i], logits_i) -> keep log_softmax(logits_i, masked)
    step i+1: allowed(ids[:i+1], ...)  -> ids[i]'s logprob and the top k of step i
    finish(ids)                        -> the last token's

The logprobs are those of the distribution the token was drawn from before temperature and
top-p (the model's, restricted by a structured-output grammar when there is one). A token
that distribution gives no chance (one the grammar forbids) has logprob -inf, which JSON cannot
carry: it is reported as `LOGPROB_FLOOR`, -9999.0, as vLLM's OpenAI server reports it, so that
`top_logprobs` still lists as many entries as asked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentcache.runtime.params import TokenConstraint

MAX_TOP = 20  # OpenAI's bound on top_logprobs
LOGPROB_FLOOR = -9999.0  # what a logprob of -inf (a forbidden token) is reported as


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (id, logprob), most likely first


class LogprobRecorder:
    """A `TokenConstraint` that records; `inner`: the reply's grammar constraint, if any."""

    def __init__(self, top: int, inner: TokenConstraint | None = None) -> None:
        self.top, self.inner = top, inner
        self.steps: list[TokenLogprob] = []
        self._pending: Tensor | None = None  # (V,) float64 log-softmax of the last step

    def allowed(self, ids: Sequence[int], logits: Tensor) -> Tensor | None:
        self._settle(ids)
        mask = self.inner.allowed(ids, logits) if self.inner is not None else None
        scores = logits if mask is None else logits.masked_fill(~mask, float("-inf"))
        self._pending = torch.log_softmax(scores.double(), dim=-1)
        return mask

    def finish(self, ids: Sequence[int]) -> tuple[TokenLogprob, ...]:
        self._settle(ids)
        return tuple(self.steps)

    def _settle(self, ids: Sequence[int]) -> None:
        if self._pending is None or len(ids) <= len(self.steps):
            return
        token = int(ids[len(self.steps)])
        lp = self._pending
        values, order = torch.topk(lp, min(self.top, lp.shape[0]))
        values = values.clamp(min=LOGPROB_FLOOR)
        top = tuple(
            (int(i), float(v)) for i, v in zip(order.tolist(), values.tolist(), strict=True)
        )
        self.steps.append(TokenLogprob(token, max(float(lp[token]), LOGPROB_FLOOR), top))
        self._pending = None

    @property
    def violations(self) -> int:
        return int(getattr(self.inner, "violations", 0))


def openai_content(
    steps: Sequence[TokenLogprob], decode: Callable[[Sequence[int]], str]
) -> list[dict[str, object]]:
    """`choices[0].logprobs.content` of OpenAI's chat API."""

    def entry(token: int, logprob: float) -> dict[str, object]:
        text = decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return [
        {**entry(s.token_id, s.logprob), "top_logprobs": [entry(i, v) for i, v in s.top]}
        for s in steps
    ]
