"""A request's segment spec: what its `kv_transfer_params` ask of the connector (no vLLM).

vLLM's OpenAI server copies a request body's `kv_transfer_params` into the request, so the
connector reads them as hostile client data. `RequestSpec.parse` checks every field before
the scheduler or a worker acts on it, and refuses the whole spec with a `PromptError` that
names the field (the connector then serves the request with exact prefix reuse only):

    field       accepted
    segments    [[kind, start, end, id, scope?], ...] tiling [0, num_tokens) in order;
                kind in system/update/fixed, start/end integers, id a short string or null
    strategy    a registered strategy spec (`name` or `name:key=value...`), at most 256 chars
    report      an alphanumeric name of at most 64 chars
    save        true / false
    stage       [start, end] integers, start <= end < num_tokens (segment specs only)
    min_reused  a number in [0, 1]
    scope_sig   the scopes' signature (below)
    anything else: refused, by name

A scope keeps a segment's KV private to one conversation, so a client that could name one
could read another conversation's KV. Scopes are issued by the server side: the party that
starts the engine (`VLLMBackend`) gives the connector a `scope_key` and signs the scopes of
each spec with it (`scope_sig`, an HMAC over the span scopes); a scope without a valid
signature, or any scope when the connector has no key, is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentcache.errors import AgentCacheError, PromptError
from agentcache.kv.store import segment_content_id
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse.spec import StrategySpec

PARAMS_KEY = "agentcache"  # key in SamplingParams.extra_args["kv_transfer_params"]
MAX_NAME_CHARS = 256  # a segment id, a scope, a strategy spec
MAX_REPORT_CHARS = 64
FIELDS = ("segments", "strategy", "report", "save", "stage", "min_reused", "scope_sig")


def sign_scopes(scopes: Sequence[str | None], key: str) -> str:
    """The HMAC-SHA256 of a spec's span scopes under the connector's `scope_key`."""
    body = json.dumps(list(scopes), separators=(",", ":")).encode()
    return hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class SegmentSpan:
    kind: SegmentKind
    start: int
    end: int
    id: str | None = None
    scope: str | None = None  # `Segment.scope`: keyed in its own namespace, private to it

    def content_id(self, token_ids: Sequence[int]) -> str:
        """The segment's store key, as agentcache's engine keys it (scope included)."""
        return segment_content_id(token_ids[self.start : self.end], self.scope)


@dataclass(frozen=True)
class RequestSpec:
    """What a request asks of the connector: segment spans and a strategy, or nothing.

    A request of a staged prefill (`stages.py`) carries `stage`, the run of stored KV it may
    claim, instead of a strategy; only the last stage of a prompt stores (`save`).
    `min_reused` overrides the connector's `min_reused_fraction` for this request (the backend
    sets 0 when it has measured that the engine fill is the faster)."""

    spans: tuple[SegmentSpan, ...] = ()
    strategy: str | None = None
    report: str | None = None  # name of the worker's report file for this request
    stage: tuple[int, int] | None = None
    save: bool = True
    min_reused: float | None = None

    def with_report(self, report: str) -> RequestSpec:
        return replace(self, report=report)

    @property
    def mode(self) -> str:
        if not self.spans:
            return "prefix"
        return "segments" if self.stage is None else "staged"

    def to_params(self, scope_key: str | None = None) -> dict[str, Any]:
        """The spec as `kv_transfer_params`; scopes are signed with `scope_key`."""
        spans = [[s.kind.value, s.start, s.end, s.id, s.scope] for s in self.spans]
        body: dict[str, Any] = {"segments": spans, "strategy": self.strategy}
        body |= {"report": self.report, "save": self.save}
        if self.stage is not None:
            body["stage"] = list(self.stage)
        if self.min_reused is not None:
            body["min_reused"] = self.min_reused
        if scope_key and any(s.scope is not None for s in self.spans):
            body["scope_sig"] = sign_scopes([s.scope for s in self.spans], scope_key)
        return {PARAMS_KEY: body}

    @classmethod
    def from_prompt(cls, prompt: TokenizedPrompt, strategy: str | None) -> RequestSpec:
        spans = tuple(
            SegmentSpan(s.kind, s.start, s.end, s.segment.id, s.segment.scope)
            for s in prompt.segments
        )
        return cls(spans, strategy)

    @classmethod
    def parse(cls, params: Any, num_tokens: int, scope_key: str | None = None) -> RequestSpec:
        """Read a request's kv_transfer_params; anything malformed is a `PromptError`."""
        body = _body(params)
        if not body:
            return cls()
        spans = _spans(body.get("segments"), num_tokens)
        _check_scopes(spans, body.get("scope_sig"), scope_key)
        if body.get("stage") is not None and not spans:
            raise PromptError("stage needs segment spans")
        return cls(
            spans, _strategy(body.get("strategy")), _report(body.get("report")),
            _stage(body.get("stage"), num_tokens), _save(body.get("save", True)),
            _min_reused(body.get("min_reused")),
        )  # fmt: skip

    def clipped(self, num_tokens: int) -> RequestSpec:
        """The spans of the prompt's first `num_tokens` tokens (the last one cut there)."""
        spans = tuple(
            replace(s, end=min(s.end, num_tokens)) for s in self.spans if s.start < num_tokens
        )
        return replace(self, spans=spans)

    def tokenized(self, token_ids: Sequence[int]) -> TokenizedPrompt:
        """The prompt as agentcache's engine sees it (texts are not needed for reuse)."""
        segs = tuple(
            TokenizedSegment(
                Segment(s.kind, "", s.id, scope=s.scope), tuple(token_ids[s.start : s.end]), s.start
            )
            for s in self.spans
        )
        return TokenizedPrompt(segs, tuple(token_ids))


def _body(params: Any) -> dict[str, Any] | None:
    """The connector's part of kv_transfer_params (None: the request asks nothing)."""
    if params is None:
        return None
    if not isinstance(params, dict):
        raise PromptError(f"kv_transfer_params must be an object, got {_kind(params)}")
    body = params.get(PARAMS_KEY)
    if body is None:
        return None
    if not isinstance(body, dict):
        raise PromptError(f"kv_transfer_params.{PARAMS_KEY} must be an object, not {_kind(body)}")
    if unknown := sorted(str(k)[:40] for k in body if k not in FIELDS):
        raise PromptError(f"unknown kv_transfer_params fields {unknown}; known: {list(FIELDS)}")
    return body


def _kind(value: Any) -> str:
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _name(value: Any, what: str) -> str | None:
    """A short optional string field (segment id, scope)."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise PromptError(f"{what} must be a string of 1-{MAX_NAME_CHARS} characters or null")
    return value


def _spans(raw: Any, num_tokens: int) -> tuple[SegmentSpan, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PromptError(f"segments must be a list of spans, got {_kind(raw)}")
    if len(raw) > num_tokens:
        raise PromptError(f"{len(raw)} segment spans for a prompt of {num_tokens} tokens")
    spans: list[SegmentSpan] = []
    for item in raw:
        spans.append(_span(item, spans[-1].end if spans else 0))
    covered = spans[-1].end if spans else num_tokens
    if covered != num_tokens:
        raise PromptError(f"segment spans cover {covered} tokens, the prompt has {num_tokens}")
    return tuple(spans)


def _span(item: Any, expect: int) -> SegmentSpan:
    if not isinstance(item, list) or len(item) not in (4, 5):
        raise PromptError(f"segment span {str(item)[:80]} is not [kind, start, end, id, scope]")
    kind, start, end, sid, *rest = item
    if not isinstance(kind, str):
        raise PromptError(f"segment kind must be a string, got {_kind(kind)}")
    if not _is_int(start) or not _is_int(end):
        raise PromptError(f"segment span ends must be integers, got {start!r:.40}, {end!r:.40}")
    if start != expect or end <= start:
        raise PromptError(
            f"segment spans must tile the prompt in order: got [{start}, {end}) "
            f"after token {expect}"
        )
    scope = _name(rest[0], "segment scope") if rest else None
    return SegmentSpan(SegmentKind.parse(kind[:16]), start, end, _name(sid, "segment id"), scope)


def _check_scopes(spans: Sequence[SegmentSpan], sig: Any, key: str | None) -> None:
    scopes = [s.scope for s in spans]
    if all(s is None for s in scopes):
        if sig is not None:
            raise PromptError("scope_sig given for spans without scopes")
        return
    if not key:
        raise PromptError("segment scopes are issued by the server: this connector has no "
                          "scope_key, so client-supplied scopes are refused")  # fmt: skip
    if not isinstance(sig, str) or not hmac.compare_digest(sig, sign_scopes(scopes, key)):
        raise PromptError("segment scopes are not signed with the connector's scope_key: refused")


def _strategy(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not 0 < len(raw) <= MAX_NAME_CHARS:
        raise PromptError(f"strategy must be a string of 1-{MAX_NAME_CHARS} characters")
    try:
        StrategySpec.parse(raw)
    except AgentCacheError as e:
        raise PromptError(f"kv_transfer_params strategy: {e}") from None
    return raw


def _report(raw: Any) -> str | None:
    if raw is None:
        return None
    ok = isinstance(raw, str) and raw.isascii() and raw.isalnum()
    if not ok or len(raw) > MAX_REPORT_CHARS:
        raise PromptError(f"report name must be alphanumeric, 1-{MAX_REPORT_CHARS} characters")
    return str(raw)


def _save(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise PromptError(f"save must be true or false, got {raw!r:.40}")
    return raw


def _min_reused(raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw <= 1:
        raise PromptError(f"min_reused must be a number in [0, 1], got {raw!r:.40}")
    return float(raw)


def _stage(raw: Any, num_tokens: int) -> tuple[int, int] | None:
    if raw is None:
        return None
    ok = isinstance(raw, list) and len(raw) == 2
    if not ok or not all(_is_int(x) for x in raw):
        raise PromptError(f"stage {str(raw)[:80]} is not [start, end]")
    start, end = raw
    if not 0 <= start <= end < num_tokens:  # [0, 0): a stage that claims nothing
        raise PromptError(
            f"stage claim [{start}, {end}) must lie before the last of the {num_tokens} tokens"
        )
    return start, end
