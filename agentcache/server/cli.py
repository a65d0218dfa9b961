"""`agentcache serve`: the OpenAI-compatible server on the loaded model, run by the embedded
engine or (`--backend vllm`) by vLLM with agentcache's KV connector."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from agentcache.argtypes import (
    byte_size,
    fraction,
    non_negative_float,
    non_negative_int,
    path_text,
    port_number,
    positive_float,
    positive_int,
)
from agentcache.backends import BACKENDS
from agentcache.engines.vllm.config import FILL_MODES, REUSE_MODES, VLLMConfig  # no vLLM
from agentcache.errors import AgentCacheError, ConfigError
from agentcache.server.config import (
    LOOPBACK_HOSTS,
    MAX_ACTIVE,
    MiB,
    ServerConfig,
    ServerLimits,
    flag,
    host_name,
    key_digest,
)
from agentcache.server.heap import limit_arenas
from agentcache.server.store_options import add_store_arguments, check_disk_folder, tier_config

if TYPE_CHECKING:
    from agentcache.backends import ServingEngine

API_KEY_ENV = "AGENTCACHE_API_KEY"
METRICS_KEY_ENV = "AGENTCACHE_METRICS_KEY"
# glibc's malloc arenas serve uses: under 16 clients for 20 minutes, 2 held 29 MiB less freed
# memory than glibc's own 16 (on 2 cores) and stayed flat, latency unchanged (docs/server.md)
MALLOC_ARENAS = 2
SECRET_ENV = "AGENTCACHE_CONVERSATION_SECRET"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    text = "serve an OpenAI-compatible chat API that reuses agents' KV cache"
    p = sub.add_parser("serve", help=text, description=text)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument(
        "--port", type=port_number, default=8000, help="port (default: 8000; 0: any free)"
    )
    p.add_argument("--strategy", default=None, help="reuse strategy (default: the default one)")
    p.add_argument("--served-model-name", default=None,
                   help="the `model` clients pass (default: the model's name)")  # fmt: skip
    p.add_argument("--max-tokens", type=positive_int, default=256,
                   help="max_tokens when a request sets none (default: 256)")  # fmt: skip
    isolate = (
        "reuse a conversation's history only for requests that echo its token, so its outputs "
        "do not depend on other conversations (default: any request of the tenant reuses any "
        "message the tenant's requests stored)"
    )
    p.add_argument("--isolate-conversations", action="store_true", help=isolate)
    p.add_argument("--kv-pages", type=positive_int, default=2048,
                   help="embedded backend: fast-tier KV pages of 16 tokens")  # fmt: skip
    p.add_argument("--kv-bytes", type=byte_size, default=None, metavar="SIZE",
                   help="the KV memory, e.g. 2GiB or 512MiB: the embedded backend's page pool, "
                   "taken as pages are first used (default: --kv-pages pages; a request "
                   "under a sparse --decode policy counts by its fast tier); the vllm "
                   "backend's paged KV memory (default: 1GiB)")  # fmt: skip
    p.add_argument("--decode", default="dense", metavar="POLICY",
                   help="embedded backend: decode policy, with options, e.g. "
                   "flexicache:verify=8 (see docs/decode.md; default: dense)")  # fmt: skip
    p.add_argument("--backend", choices=BACKENDS, default="embedded",
                   help="execution engine: agentcache's own (embedded) or vLLM with agentcache's "
                   "KV connector (needs the vllm extra; see docs/vllm.md)")  # fmt: skip
    p.add_argument("--vllm-reuse", choices=REUSE_MODES, default="agentcache",
                   help="vllm backend: agentcache (vLLM's prefix cache + the connector), prefix "
                   "(vLLM's prefix cache alone) or none (default: agentcache)")  # fmt: skip
    p.add_argument(
        "--store-dir",
        type=path_text,
        default=None,
        help="vllm backend: the shared segment folder (default: <cache>/vllm-store)",
    )
    p.add_argument("--vllm-folder-bytes", type=byte_size, default=None, metavar="SIZE",
                   help="vllm backend: the bound the shared segment folder is evicted to, "
                   "least recently used first; --retention-share is a share of it "
                   "(default: 16GiB)")  # fmt: skip
    p.add_argument("--vllm-fill", choices=FILL_MODES, default="auto",
                   help="vllm backend: who computes what reuse cannot supply: vllm (staged "
                   "prefills; pic, epic or rpdc:selection=offset:...), engine (agentcache's "
                   "engine in vLLM's worker) or auto (default; see docs/vllm.md)")  # fmt: skip
    p.add_argument("--max-model-len", type=positive_int, default=8192,
                   help="vllm backend: context length (default: 8192)")  # fmt: skip
    add_store_arguments(p)
    add_security(p)
    add_limits(p)
    return p


def add_security(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="accept requests bearing this key (repeat for several; each key is "
                   f"its own tenant; default: ${API_KEY_ENV}, comma-separated, else no "
                   "authentication)")  # fmt: skip
    p.add_argument("--metrics-key", action="append", default=None, metavar="KEY",
                   help="only this key (repeatable) may read /metrics, which counts every "
                   f"tenant's traffic (default: ${METRICS_KEY_ENV}, else any accepted "
                   "key)")  # fmt: skip
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name to answer besides localhost, 127.0.0.1 and [::1] on a "
                   "loopback bind (repeatable)")  # fmt: skip
    p.add_argument("--enable-docs", action="store_true",
                   help="serve /docs, /redoc and /openapi.json")  # fmt: skip
    p.add_argument("--conversation-secret", default=None, metavar="SECRET",
                   help="signs conversation tokens, so they survive a restart (>= 16 "
                   f"characters; default: ${SECRET_ENV}, else one per process)")  # fmt: skip
    p.add_argument("--request-timeout", type=positive_float, default=600.0, metavar="SECONDS",
                   help="a request's deadline, waiting included (default: 600)")  # fmt: skip
    p.add_argument("--max-queued", type=non_negative_int, default=64,
                   help="requests waiting for the engine; more get 503 (default: 64)")  # fmt: skip
    p.add_argument("--max-active-per-tenant", type=positive_int, default=None, metavar="N",
                   help="slots of --max-active one tenant (API key + cache_salt) may hold "
                   "while other tenants have requests; the rest stay free for them (default: "
                   "all but an eighth, 14 of 16; a tenant alone may hold every slot)")  # fmt: skip
    p.add_argument("--max-queued-tokens", type=positive_int, default=262_144,
                   help="prompt tokens of the requests waiting for the engine; more get 503, "
                   "shared fairly between tenants (default: 262144)")  # fmt: skip
    p.add_argument("--max-tokenizing-chars", type=positive_int, default=8_000_000,
                   help="characters of requests being tokenized at once; more get 503 "
                   "(default: 8000000; a tenant with a request in flight holds at most "
                   "half)")  # fmt: skip
    p.add_argument("--max-active", type=positive_int, default=None,
                   help="requests the engine runs at once, interleaved token by token, so a "
                   f"short request is not held behind a long one (default: {MAX_ACTIVE} on the "
                   "embedded backend; on vllm, its max_num_seqs: see docs/vllm.md)")  # fmt: skip
    p.add_argument("--max-active-tokens", type=positive_int, default=None, metavar="N",
                   help="tokens (prompt + max_tokens) the active requests may hold at once; a "
                   "request waits in line until its own fit, a tenant holds at most its share "
                   "(default: on vllm, the tokens its KV cache holds; none on the embedded "
                   "backend, whose engine admits by its KV pages)")  # fmt: skip
    p.add_argument("--batch-decode", action=argparse.BooleanOptionalAction, default=True,
                   help="embedded backend: the active requests decode as one batch per step, "
                   "a lone one as without batching (default; --no-batch-decode: each steps "
                   "alone, interleaved; see docs/server.md)")  # fmt: skip
    p.add_argument("--prefill-chunk-tokens", type=non_negative_int, default=None, metavar="N",
                   help="embedded backend, with batching: a long prefill that can run in chunks "
                   "(the full strategy's) computes at most N tokens per step, each step also "
                   "decoding the active requests (default: 0, every prefill runs whole, "
                   "stalling decoding for its duration; e.g. 512 with many agents)")  # fmt: skip
    p.add_argument("--prefill-burst-tokens", type=non_negative_int, default=None, metavar="N",
                   help="embedded backend, with batching: prefills waiting for the engine run "
                   "back to back between two decode steps while their tokens to compute fit "
                   "in N, at least one (default: 2048; 0: one prefill per step; see docs/server.md "
                   "\"Prefill bursts\")")  # fmt: skip
    p.add_argument("--prefill-order", choices=("shortest", "arrival"), default=None,
                   help="embedded backend: the order prefills waiting for the engine run in: "
                   "shortest (default: the fewest tokens of text the store does not hold "
                   "first, none passed over by more than 8), or arrival; outputs are the same "
                   "either way")  # fmt: skip
    p.add_argument("--preemption", choices=("swap", "recompute"), default=None,
                   help="embedded backend, with batching: when the KV pool is full, the newest "
                   "running request is preempted, its KV copied to host memory (swap) or "
                   "dropped and recomputed (recompute), and resumed when pages free up "
                   "(default: off; a request then runs to what the pool holds)")  # fmt: skip
    p.add_argument("--preemption-host-bytes", type=byte_size, default=None, metavar="SIZE",
                   help="with --preemption swap: host memory for swapped KV at once; beyond "
                   "it a preempted request is recomputed (default: 1GiB)")  # fmt: skip
    p.add_argument("--no-share-pages", dest="share_pages", action="store_false",
                   help="embedded backend: each request holds its own KV pages (default: running "
                   "requests of one tenant whose prompts open alike hold the opening's pages "
                   "once where their K/V is the same, bit for bit; outputs are the same either "
                   "way)")  # fmt: skip
    p.add_argument("--conversation-bytes", type=positive_int, default=64 * MiB,
                   help="memory for what the server remembers of conversations (default: "
                   "64 MiB; the least recently used are forgotten)")  # fmt: skip
    p.add_argument("--stored-responses", type=non_negative_int, default=4096, metavar="N",
                   help="/v1/responses kept for previous_response_id (default: 4096; 0: none; "
                   "the oldest are forgotten)")  # fmt: skip
    p.add_argument("--stored-response-bytes", type=positive_int, default=64 * MiB,
                   help="memory for stored responses' messages (default: 64 MiB)")  # fmt: skip
    p.add_argument("--stored-response-ttl", type=positive_float, default=3600.0,
                   metavar="SECONDS", help="how long a stored response is kept (default: "
                   "3600)")  # fmt: skip
    p.add_argument("--max-retention", type=positive_int, default=3600, metavar="SECONDS",
                   help="the longest cache retention a request's cache_control ttl, "
                   "prompt_cache_retention or prompt_cache_options.ttl is granted, and the cap "
                   "on the retention learned for turns that end in a tool call (default: "
                   "3600)")  # fmt: skip
    p.add_argument("--retention-default", type=non_negative_float, default=60.0,
                   metavar="SECONDS", help="how long a turn that ends in a tool call keeps its "
                   "segments before enough tool pauses are seen to learn it (default: 60; "
                   "capped at --max-retention)")  # fmt: skip
    p.add_argument("--retention-share", type=fraction, default=0.25, metavar="FRACTION",
                   help="of the segment store (with tiers: its fast tier), the most bytes "
                   "retained segments may hold; beyond it a retention is refused and reported "
                   "(default: 0.25)")  # fmt: skip
    p.add_argument("--retention-tenant-share", type=share_of_share, default=0.5,
                   metavar="FRACTION", help="of --retention-share, the most one tenant's "
                   "retained segments may hold, so one tenant cannot fill it; beyond it a "
                   "retention is refused and reported (default: 0.5)")  # fmt: skip
    p.add_argument("--retention-tenant-reserve", type=fraction, default=None,
                   metavar="FRACTION", help="of --retention-share, what each tenant is "
                   "guaranteed: its retained segments up to it are never released early, and "
                   "a tenant under it releases other tenants' segments beyond theirs to get "
                   "it (0: none; at most --retention-tenant-share; default: 0.25, or "
                   "--retention-tenant-share when lower)")  # fmt: skip
    p.add_argument("--trim-interval", type=non_negative_float, default=10.0, metavar="SECONDS",
                   help="seconds between handing freed heap memory back to the system, so "
                   "resident memory stays flat under load (glibc only; 0: never; "
                   "default: 10)")  # fmt: skip
    p.add_argument("--malloc-arenas", type=non_negative_int, default=MALLOC_ARENAS, metavar="N",
                   help="cap glibc's malloc arenas, which the worker threads otherwise each "
                   "take, so memory freed by one turn is found by the next (glibc only; "
                   f"default: {MALLOC_ARENAS}; 0: glibc's own, 8 per core)")  # fmt: skip


def add_limits(p: argparse.ArgumentParser) -> None:
    defaults = ServerLimits()
    for f in fields(ServerLimits):
        default = getattr(defaults, f.name)
        p.add_argument(flag(f.name), type=positive_int, default=default,
                       help=f"request limit (default: {default})")  # fmt: skip


def server_config(
    args: argparse.Namespace, model_name: str, engine_max_active: int | None = None,
    engine_kv_tokens: int | None = None, engine_block_tokens: int | None = None,
) -> ServerConfig:  # fmt: skip
    """The serve flags (and the environment variables they default to) as a ServerConfig;
    `ConfigError` for bad ones (`check_flags`). `engine_max_active`, `engine_kv_tokens`: the
    vLLM backend's `max_active` and `kv_tokens`, the defaults of `--max-active` (ValueError
    without either) and `--max-active-tokens` there; `engine_block_tokens`: its
    `prefix_block_tokens` (prefix blocks active requests share count once)."""
    max_active = flag_max_active(args) or engine_max_active
    max_active_tokens = args.max_active_tokens
    if max_active_tokens is None and args.backend == "vllm":
        max_active_tokens = engine_kv_tokens
    if max_active is None:
        raise ValueError("--backend vllm without --max-active needs the engine's max_active")
    check_flags(args, max_active)
    keys = flag_keys(args.api_key, API_KEY_ENV)
    metrics_keys = flag_keys(args.metrics_key, METRICS_KEY_ENV)
    secret = conversation_secret(args)
    return ServerConfig(
        model_name, args.max_tokens, isolate_conversations=args.isolate_conversations,
        limits=ServerLimits(**{f.name: getattr(args, f.name) for f in fields(ServerLimits)}),
        request_timeout_s=args.request_timeout, max_queued=args.max_queued,
        max_queued_tokens=args.max_queued_tokens, max_tokenizing_chars=args.max_tokenizing_chars,
        max_active_per_tenant=args.max_active_per_tenant,
        max_active=max_active, max_active_tokens=max_active_tokens,
        prefix_block_tokens=engine_block_tokens,
        api_key_digests=frozenset(key_digest(k.strip()) for k in keys),
        metrics_key_digests=frozenset(key_digest(k.strip()) for k in metrics_keys),
        allowed_hosts=allowed_hosts(args.host, args.allowed_host), enable_docs=args.enable_docs,
        conversation_secret=secret.encode() if secret else None,
        tracker_bytes=args.conversation_bytes, trim_interval_s=args.trim_interval,
        max_stored_responses=args.stored_responses,
        stored_response_bytes=args.stored_response_bytes,
        stored_response_ttl_s=args.stored_response_ttl,
        max_retention_s=args.max_retention, retention_default_s=args.retention_default,
        retention_share=args.retention_share,
        retention_tenant_share=args.retention_tenant_share,
        retention_tenant_reserve=args.retention_tenant_reserve,
    )  # fmt: skip


def admission_summary(server: ServerConfig) -> str:
    """What the engine admits at once, in words (printed when the server starts)."""
    out = (f"at most {server.max_active} requests at the engine, {server.tenant_slots} of "
           "them one tenant's while others have requests")  # fmt: skip
    if server.max_active_tokens is not None:
        out += f"; at most {server.max_active_tokens} tokens (prompt + max_tokens) reserved"
        if server.prefix_block_tokens is not None:
            out += (f", prompt prefixes shared in blocks of {server.prefix_block_tokens} "
                    "tokens counted once")  # fmt: skip
    return out + " (--max-active, --max-active-per-tenant, --max-active-tokens)"


def flag_max_active(args: argparse.Namespace) -> int | None:
    """`--max-active`, else the embedded backend's default; None on the vLLM backend, whose
    default is the engine's `max_active` (known once it has loaded)."""
    if args.max_active:
        return int(args.max_active)
    return None if args.backend == "vllm" else MAX_ACTIVE


def check_flags(args: argparse.Namespace, max_active: int | None) -> None:
    """`ConfigError` for a bad combination of serve flags (and environment variables); `serve`
    runs it before the model loads. `max_active`: the final `--max-active`; None while it waits
    for the engine, and with it the per-tenant bound (`server_config` checks it then)."""
    if any(not k.strip() for k in flag_keys(args.api_key, API_KEY_ENV)):
        raise ConfigError("--api-key must not be empty")
    if any(not k.strip() for k in flag_keys(args.metrics_key, METRICS_KEY_ENV)):
        raise ConfigError("--metrics-key must not be empty")
    secret = conversation_secret(args)
    if secret is not None and len(secret) < 16:
        raise ConfigError(f"--conversation-secret (or ${SECRET_ENV}) needs >= 16 characters")
    if args.preemption is not None and (args.backend != "embedded" or not args.batch_decode):
        raise ConfigError("--preemption needs the embedded backend with batched decode "
                          "(drop --no-batch-decode / --backend vllm)")  # fmt: skip
    if args.prefill_order is not None and args.backend != "embedded":
        raise ConfigError("--prefill-order applies to the embedded backend (vLLM's scheduler "
                          "orders its own prefills)")  # fmt: skip
    if args.prefill_burst_tokens is not None and (
        args.backend != "embedded" or not args.batch_decode
    ):
        raise ConfigError("--prefill-burst-tokens needs the embedded backend with batched "
                          "decode (drop --no-batch-decode / --backend vllm)")  # fmt: skip
    if args.preemption_host_bytes is not None and args.preemption != "swap":
        raise ConfigError("--preemption-host-bytes applies to --preemption swap only")
    if not args.share_pages and args.backend != "embedded":
        raise ConfigError("--no-share-pages applies to the embedded backend (vLLM's prefix "
                          "cache shares its blocks itself)")  # fmt: skip
    reserve = args.retention_tenant_reserve
    if reserve is not None and reserve > args.retention_tenant_share:
        raise ConfigError(f"--retention-tenant-reserve {reserve:g} exceeds "
                          f"--retention-tenant-share {args.retention_tenant_share:g}")  # fmt: skip
    per_tenant = args.max_active_per_tenant
    if max_active is not None and per_tenant is not None and per_tenant > max_active:
        raise ConfigError(f"--max-active-per-tenant {per_tenant} exceeds "
                          f"--max-active {max_active}")  # fmt: skip


def flag_keys(given: list[str] | None, env: str) -> list[str]:
    """The keys given, else the environment variable's, comma-separated."""
    return given or [k for k in os.environ.get(env, "").split(",") if k]


def conversation_secret(args: argparse.Namespace) -> str | None:
    return args.conversation_secret or os.environ.get(SECRET_ENV) or None


def share_of_share(text: str) -> float:
    """A fraction above 0 and at most 1 (a tenant's part of the retained share)."""
    value = fraction(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a number above 0 and at most 1, got {text!r}")
    return value


def allowed_hosts(bind: str, extra: list[str]) -> frozenset[str] | None:
    """On a loopback bind: the loopback names and `extra` (a page that resolves its own name
    to 127.0.0.1, DNS rebinding, gets 421); elsewhere any Host unless `extra` names some."""
    names = frozenset(host_name(h) for h in extra)
    if is_loopback(bind):
        return frozenset(LOOPBACK_HOSTS) | names
    return names or None


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def served_name(model_id: str) -> str:
    """`name#weights-fingerprint` -> `name`."""
    return model_id.split("#", 1)[0]


def serve(args: argparse.Namespace, model: str | None, cache_dir: Path) -> int:
    try:
        import uvicorn
    except ImportError:
        raise AgentCacheError(
            "agentcache serve needs the server extra: pip install 'agentcache[server]'"
        ) from None
    from agentcache.server.app import create_app

    if args.served_model_name == "":
        raise ConfigError("--served-model-name must not be empty")
    check_flags(args, flag_max_active(args))  # bad flags fail before the model loads
    check_disk_folder(tier_config(args))
    if args.malloc_arenas:
        limit_arenas(args.malloc_arenas)  # before any thread allocates
    # bound before the model loads (which can take minutes) and held until uvicorn serves on
    # it: a port in use fails at once, and no other process can take it meanwhile
    with bind_address(args.host, args.port) as sock:
        engine = serving_engine(args, model, cache_dir)
        name = args.served_model_name or served_name(engine.model_id)
        server = server_config(args, name, getattr(engine, "max_active", None),
                               getattr(engine, "kv_tokens", None),
                               getattr(engine, "prefix_block_tokens", None))  # fmt: skip
        config = uvicorn.Config(create_app(engine, server), log_level="info")
        host, port = sock.getsockname()[:2]
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        print(f"agentcache serve: {server.model_name} on {url} (Ctrl+C to quit)", file=sys.stderr)
        print(f"agentcache serve: {admission_summary(server)}", file=sys.stderr)
        uvicorn.Server(config).run(sockets=[sock])
    return 0


def bind_address(host: str, port: int) -> socket.socket:
    """A socket listening on host:port; uvicorn serves on it once the app is ready (connections
    made before wait in its backlog). ConfigError when it cannot (unknown host, port in use)."""
    sock = None
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = info[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        sock.bind(address)
        sock.listen(2048)  # uvicorn's backlog; listening now keeps the port ours
    except OSError as e:
        if sock is not None:
            sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port} ({e.strerror or e}); choose another --host or --port"
        ) from e
    return sock


def vllm_config(
    args: argparse.Namespace, model: str | None, strategy: str, cache_dir: Path
) -> VLLMConfig:
    """`--backend vllm`'s engine settings from the flags (imports no vLLM)."""
    store_dir = args.store_dir or str(cache_dir / "vllm-store")
    extra = {} if args.vllm_folder_bytes is None else {"folder_bytes": args.vllm_folder_bytes}
    if args.kv_bytes is not None:
        extra["kv_cache_bytes"] = args.kv_bytes
    return VLLMConfig(
        model=model, reuse=args.vllm_reuse, strategy=strategy, store_dir=store_dir,
        max_model_len=args.max_model_len, fill=args.vllm_fill, **extra,
    )  # fmt: skip


def serving_engine(args: argparse.Namespace, model: str | None, cache_dir: Path) -> ServingEngine:
    """The engine of `--backend`. vLLM absent: `VLLMUnavailableError` (naming the extra)
    before anything loads; `agentcache` prints it and exits with 2."""
    from agentcache.reuse import DEFAULT_STRATEGY, STRATEGIES, StrategySpec

    strategy = args.strategy or DEFAULT_STRATEGY
    if args.backend == "vllm":  # a spec with options; unknown names fail before anything loads
        from agentcache.engines.vllm.stages import staged_strategy

        spec = StrategySpec.parse(strategy)
        if args.vllm_fill == "vllm":
            staged_strategy(spec)
        from agentcache.engines.vllm import require_vllm

        require_vllm()
        from agentcache.engines.vllm.backend import VLLMBackend

        return VLLMBackend(vllm_config(args, model, strategy, cache_dir), cache_dir)
    STRATEGIES.get(strategy)  # unknown names fail before anything loads
    from agentcache.decode.config import DecodeConfig
    from agentcache.model.loading import load_model
    from agentcache.runtime.engine import Engine, EngineConfig
    from agentcache.tiers.base import TierCapacityError

    try:
        decode = DecodeConfig.from_spec(args.decode, profile_dir=cache_dir / "profiles")
    except (ValueError, AgentCacheError) as e:
        raise AgentCacheError(f"--decode {args.decode}: {e}") from e
    tiers = tier_config(args)
    loaded = load_model(model, cache_dir)
    default = EngineConfig()
    engine_config = EngineConfig(
        strategy, kv_pages=args.kv_pages, kv_bytes=args.kv_bytes, decode=decode, tiers=tiers,
        batch_decode=args.batch_decode, preemption=args.preemption,
        store_bytes=default.store_bytes if args.store_bytes is None else args.store_bytes,
        preemption_host_bytes=default.preemption_host_bytes
        if args.preemption_host_bytes is None else args.preemption_host_bytes,
        prefill_chunk_tokens=default.prefill_chunk_tokens
        if args.prefill_chunk_tokens is None else args.prefill_chunk_tokens,
        prefill_order=default.prefill_order if args.prefill_order is None else args.prefill_order,
        prefill_burst_tokens=default.prefill_burst_tokens
        if args.prefill_burst_tokens is None else args.prefill_burst_tokens,
        share_pages=args.share_pages,
    )  # fmt: skip
    try:
        return Engine(loaded, engine_config)
    except TierCapacityError as e:
        raise ConfigError(f"{e} (fast_bytes: --store-bytes, host_bytes: --store-host-bytes, "
                          "disk_bytes: --store-disk-bytes; kv_pages: --kv-pages or "
                          "--kv-bytes)") from e  # fmt: skip
