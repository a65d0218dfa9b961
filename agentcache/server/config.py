"""The server's settings: plain frozen values, importable without the server extra (the CLI
builds them before anything of FastAPI loads)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields

from agentcache.fieldtypes import check_field_types
from agentcache.kv.retention import RetentionConfig

MiB = 1 << 20
MAX_ACTIVE = 16  # requests the embedded engine runs at once, by default


@dataclass(frozen=True)
class ServerLimits:
    """Defaults fit an agent's whole history on a long-context model; each is a serve flag
    (`--max-body-bytes` for `max_body_bytes`, ...)."""

    max_body_bytes: int = 8 * MiB
    max_depth: int = 64  # JSON nesting of the body (a tool schema, a tool call's arguments)
    max_messages: int = 2048
    max_tools: int = 256
    max_stop: int = 16  # stop strings
    max_stop_chars: int = 256  # characters of one stop string
    max_user_chars: int = 256  # the `user` field
    max_content_chars: int = 4_000_000  # message contents and tool-call arguments, all together
    max_tool_chars: int = 1_000_000  # tool names, descriptions and parameter schemas, together

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{f.name} must be an integer >= 1, got {value!r}")


def flag(name: str) -> str:
    """The serve flag of a limit: max_body_bytes -> --max-body-bytes."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # the name clients pass as `model`
    default_max_tokens: int = 256  # when a request sets none (clamped to the context left)
    # history reused only within its conversation (the tenant's system prefix still shared);
    # by default within the tenant (chat/segmenter.py)
    isolate_conversations: bool = False
    limits: ServerLimits = field(default_factory=ServerLimits)
    request_timeout_s: float = 600.0  # waiting in line + generating
    max_queued: int = 64  # requests waiting for the engine; more get 503
    max_active: int = MAX_ACTIVE  # requests the engine runs at once, interleaved by token
    # slots of max_active one tenant may hold while others have requests (None: all but an
    # eighth, kept for the others; a tenant alone holds every slot, admission.py)
    max_active_per_tenant: int | None = None
    # tokens (prompt + max_tokens) the active requests may reserve at once, each tenant its
    # share of them (admission.py); None: the engine admits by its own KV pages (embedded)
    max_active_tokens: int | None = None
    # tokens per block of the engine's prefix cache: whole blocks of prompt prefix that active
    # requests of a tenant share count once against max_active_tokens (the vLLM backend's
    # block_size); None: every reserve counts whole
    prefix_block_tokens: int | None = None
    max_queued_tokens: int = 262_144  # prompt tokens of the waiting requests; more get 503
    # characters being tokenized at once (before a request has tokens to queue by)
    max_tokenizing_chars: int = 8_000_000
    api_key_digests: frozenset[str] = frozenset()  # key_digest of each accepted key
    # key_digest of the keys that alone may read /metrics (empty: any accepted key)
    metrics_key_digests: frozenset[str] = frozenset()
    allowed_hosts: frozenset[str] | None = None  # Host names answered; None: any
    enable_docs: bool = False  # /docs, /redoc, /openapi.json
    conversation_secret: bytes | None = None  # signs conversation tokens; None: per process
    tracker_bytes: int = 64 * MiB  # what the server remembers of conversations
    # /v1/responses kept for previous_response_id (response_store.py): entries, bytes, seconds
    max_stored_responses: int = 4096
    stored_response_bytes: int = 64 * MiB
    stored_response_ttl_s: float = 3600.0
    trim_interval_s: float = 10.0  # seconds between returning freed heap memory (0: never)
    # the longest cache retention a request may ask for (cache_control ttl,
    # prompt_cache_retention): granted up to this and reported (server/cache_control.py);
    # also the cap on the retention learned for turns that end in a tool call
    max_retention_s: int = 3600
    # a tool-call turn's retention before enough pauses are seen to learn it (capped above)
    retention_default_s: float = 60.0
    retention_share: float = 0.25  # of the store (its fast tier), the most retained bytes
    # of those, the most one tenant's retained bytes (one tenant cannot fill the share)
    retention_tenant_share: float = 0.5
    # of those, each tenant's guaranteed part: its pins up to it are never ended early, and
    # a tenant under it ends other tenants' pins beyond theirs to get it (None: 0.25, or the
    # tenant share when lower; RetentionConfig.reserve)
    retention_tenant_reserve: float | None = None

    def __post_init__(self) -> None:
        check_field_types(self)  # plain fields by their declared types
        if not self.model_name:
            raise ValueError("model_name must be non-empty")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if not self.request_timeout_s > 0:
            raise ValueError("request_timeout_s must be > 0")
        if self.max_queued < 0 or self.tracker_bytes < 1:
            raise ValueError("max_queued must be >= 0 and tracker_bytes >= 1")
        if self.max_active < 1:
            raise ValueError("max_active must be >= 1")
        if self.max_active_tokens is not None and self.max_active_tokens < 1:
            raise ValueError("max_active_tokens must be >= 1")
        if self.prefix_block_tokens is not None and self.prefix_block_tokens < 1:
            raise ValueError("prefix_block_tokens must be >= 1")
        per = self.max_active_per_tenant
        if per is not None and not 1 <= per <= self.max_active:
            raise ValueError("max_active_per_tenant must be in [1, max_active]")
        if self.max_queued_tokens < 1 or self.max_tokenizing_chars < 1:
            raise ValueError("max_queued_tokens and max_tokenizing_chars must be >= 1")
        if not self.trim_interval_s >= 0:
            raise ValueError("trim_interval_s must be >= 0")
        if self.max_retention_s < 1:
            raise ValueError("max_retention_s must be >= 1")
        if not isinstance(self.limits, ServerLimits):
            raise ValueError(f"limits must be a ServerLimits, got {self.limits!r:.60}")
        stored = (self.max_stored_responses, self.stored_response_bytes)
        if min(stored) < 0 or not self.stored_response_ttl_s > 0:
            raise ValueError("max_stored_responses and stored_response_bytes must be >= 0 and "
                             "stored_response_ttl_s > 0")  # fmt: skip
        _ = self.retention  # checks the retention settings

    @property
    def retention(self) -> RetentionConfig:
        """Retention of turns across tool pauses (chat/retention.py)."""
        return RetentionConfig(
            min(self.retention_default_s, self.max_retention_s), self.max_retention_s,
            self.retention_share, tenant_share=self.retention_tenant_share,
            tenant_reserve=self.retention_tenant_reserve,
        )  # fmt: skip

    @property
    def tenant_slots(self) -> int:
        """Slots at the engine one tenant may hold while other tenants have requests: by
        default all but an eighth (14 of 16), which stay free for them; with fewer than 8,
        all. A tenant alone may hold every slot (`AdmissionLine`)."""
        if self.max_active_per_tenant is not None:
            return self.max_active_per_tenant
        return self.max_active - self.max_active // 8


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def key_digest(key: str) -> str:
    """What the server keeps of an API key (and names its tenant by)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def host_name(host: str) -> str:
    """`Host` header -> the host, lower case, without its port ("[::1]:8000" -> "[::1]")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
