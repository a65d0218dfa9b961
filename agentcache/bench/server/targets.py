"""The servers a replay runs against, each in a process of its own on a free loopback port.

| target            | process                                                          |
|-------------------|------------------------------------------------------------------|
| `embedded`        | `agentcache serve` (the default strategy)                        |
| `embedded-prefix` | `agentcache serve --strategy prefix` (exact prefix caching)      |
| `vllm-backend`    | `agentcache serve --backend vllm`, in the vLLM venv's Python     |
| `vllm`            | plain `vllm serve --enable-prefix-caching` on the same model folder |

A variant runs a target with more server arguments under a label of its own, `target@name`:
`--targets embedded,embedded@tiers --target-args 'embedded@tiers=--store-host-bytes 1GiB'`
(`parse_targets`). The agentcache-served targets take them; plain vLLM takes its own
(`--vllm-serve-args`), the same for every phase.

On the tiny random model (`model == "tiny"`), the two embedded targets run
`benchmarks/server/tiny_serve.py` instead, which serves the same app on that model; the vLLM
targets need a model folder. Plain vLLM gets the engine settings `VLLMBackend` gives it
(float32, block size 32, eager, max model length 8192, 1 GiB of KV, up to 256 requests at once,
chunked prefill off with a step's budget of one whole prompt and a token for each running
request, docs/vllm.md "Batching") and the same thread count (`thread_env`), so the two vLLM
targets differ by agentcache's server and connector alone. Plain vLLM starts through
`benchmarks/server/vllm_serve.py` (its CPU wheel's own `vllm` script cannot find its version).
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from agentcache.chat.tools import chat_template
from agentcache.testing import LoopbackProcess

SERVED_NAME = "replay"
TARGETS = ("embedded", "embedded-prefix", "vllm-backend", "vllm")
AGENTCACHE_ARGS = {"embedded": (), "embedded-prefix": ("--strategy", "prefix"),
                   "vllm-backend": ("--backend", "vllm")}  # fmt: skip
VLLM_ENGINE_ARGS = (
    "--dtype", "float32", "--block-size", "32", "--enforce-eager", "--max-model-len", "8192",
    "--max-num-seqs", "256", "--max-num-batched-tokens", str(8192 + 256),
    "--no-enable-chunked-prefill", "--kv-cache-memory-bytes", str(1 << 30),
    "--gpu-memory-utilization", "0.1", "--enable-prefix-caching", "--enable-prompt-tokens-details",
)  # fmt: skip
DEFAULT_VLLM_EXTRA = "--enable-auto-tool-choice --tool-call-parser hermes"


@dataclass(frozen=True)
class Target:
    """A server to replay against: `base`, one of TARGETS, started with `args` more; `label`
    names it in the report and results (`base`, or `base@variant`)."""

    label: str
    base: str
    args: tuple[str, ...] = ()


def parse_targets(labels: Sequence[str], target_args: Sequence[str] = ()) -> list[Target]:
    """`labels` (`embedded`, `embedded@tiers`, ...) with each `LABEL=ARGS` of `target_args`
    (ARGS split as a shell would). ValueError naming the problem: an unknown base target, a
    label given twice, args for a label not among `labels` or given twice, args for plain
    vllm (`--vllm-serve-args` is its), a variant (`@`) without args."""
    args: dict[str, tuple[str, ...]] = {}
    for item in target_args:
        label, sep, text = item.partition("=")
        label = label.strip()
        if not sep or not label:
            raise ValueError(f"--target-args takes LABEL=ARGS, got {item!r}")
        if label not in labels:
            raise ValueError(f"--target-args for {label!r}, which --targets does not name")
        if label in args:
            raise ValueError(f"--target-args gives {label!r} twice")
        try:
            args[label] = tuple(shlex.split(text))
        except ValueError as e:
            raise ValueError(f"--target-args for {label!r}: {e}") from None
    out: list[Target] = []
    for label in labels:
        base, at, variant = label.partition("@")
        if base not in TARGETS or (at and not variant):
            raise ValueError(
                f"unknown target {label!r}; choose from {', '.join(TARGETS)}, each optionally "
                "as TARGET@NAME with --target-args"
            )
        if label in (t.label for t in out):
            raise ValueError(f"target {label!r} is named twice")
        if base == "vllm" and args.get(label):
            raise ValueError(f"{label}: plain vllm takes --vllm-serve-args, not --target-args")
        if at and not args.get(label):
            raise ValueError(f"variant {label!r} needs its server arguments: --target-args "
                             f"'{label}=...'")  # fmt: skip
        out.append(Target(label, base, args.get(label, ())))
    return out


@dataclass(frozen=True)
class TargetOptions:
    """How targets start: `model` is `tiny`, `default` or a model folder; `vllm_python` the
    vLLM venv's interpreter; `vllm_extra` more `vllm serve`
    arguments (its tool-call parser); `threads` torch threads of the agentcache servers;
    `model_folder` the folder plain vLLM loads (the converted default model for `default`);
    `vllm_chat_template` the chat template plain vLLM renders requests with (by default the
    one that renders messages and tools as agentcache's server does, so both targets get the
    same prompts; None: the model's own)."""

    model: str = "default"
    vllm_python: str | None = None
    vllm_extra: str = DEFAULT_VLLM_EXTRA
    threads: int = 1
    model_folder: str | None = None
    vllm_chat_template: str | None = str(chat_template())


# scripts, not modules of the bench: the bench does not import the server (pyproject's layers)
TINY_SERVE = Path(__file__).resolve().parents[3] / "benchmarks" / "server" / "tiny_serve.py"
# `vllm serve` for vLLM's CPU wheel, whose own `vllm` script cannot find its version
VLLM_SERVE = TINY_SERVE.with_name("vllm_serve.py")


def command(target: Target | str, port: int, o: TargetOptions) -> list[str]:
    """The command line that serves `target` (a name: the target as it is) on
    127.0.0.1:`port`, its variant's arguments last. ValueError for a target these options
    cannot start."""
    (t,) = parse_targets([target]) if isinstance(target, str) else (target,)
    name, extra = t.base, t.args
    if o.model == "tiny":
        if name.startswith("vllm"):
            raise ValueError(f"target {name} needs a model folder, not the tiny model")
        return [sys.executable, str(TINY_SERVE), "--port", str(port),
                "--served-model-name", SERVED_NAME, *AGENTCACHE_ARGS[name], *extra]  # fmt: skip
    if name.startswith("vllm") and o.vllm_python is None:
        raise ValueError(f"target {name} needs --vllm-python (the vLLM venv's interpreter)")
    if name == "vllm":
        if o.model_folder is None:
            raise ValueError("target vllm needs the model folder")
        template = [] if o.vllm_chat_template is None else ["--chat-template", o.vllm_chat_template]
        return [str(o.vllm_python), str(VLLM_SERVE), "serve", o.model_folder, "--host",
                "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME,
                *VLLM_ENGINE_ARGS, *template, *shlex.split(o.vllm_extra)]  # fmt: skip
    python = str(o.vllm_python) if name == "vllm-backend" else sys.executable
    model = [] if o.model == "default" else ["--model", o.model]
    return [python, "-m", "agentcache", "serve", "--port", str(port), "--served-model-name",
            SERVED_NAME, "--threads", str(o.threads), *model, *AGENTCACHE_ARGS[name],
            *extra]  # fmt: skip


class ServerProcess(LoopbackProcess):
    """`target` started on a free loopback port (`agentcache.testing.LoopbackProcess`), its
    output appended to `log`. A `vllm-backend` phase gets a store folder of its own, removed
    when it closes (`phase_store_args`): its segments live in a folder, not in the process,
    and a phase must start from an empty store as the other targets' fresh processes do."""

    def __init__(self, target: Target, options: TargetOptions, log: Path,
                 start_timeout_s: float = 900.0) -> None:  # fmt: skip
        self.target = target
        self._store: tempfile.TemporaryDirectory[str] | None = None
        if needs_phase_store(target):
            self._store = tempfile.TemporaryDirectory(prefix="replay-store-")
            target = replace(target, args=(*target.args, *phase_store_args(self._store.name)))
        super().__init__(target.label, lambda port: command(target, port, options), log,
                         thread_env(target.base, options.threads), start_timeout_s)  # fmt: skip

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._store is not None:
                self._store.cleanup()
                self._store = None


def needs_phase_store(target: Target) -> bool:
    """A `vllm-backend` target whose arguments name no store folder of their own."""
    return target.base == "vllm-backend" and "--store-dir" not in target.args


def phase_store_args(folder: str) -> tuple[str, ...]:
    """The `agentcache serve --backend vllm` arguments that keep a phase's segments in
    `folder` (by default they go to the cache folder's `vllm-store`, shared by every process
    and kept across them)."""
    return ("--store-dir", folder)


def thread_env(target: str, threads: int) -> dict[str, str]:
    """Every target gets `threads` threads: agentcache's servers through
    AGENTCACHE_NUM_THREADS; plain vLLM through OMP_NUM_THREADS with its CPU binding off (by
    default it binds OpenMP threads to cores of its own choosing, on a machine whose cores
    the other processes of the run share)."""
    if target == "vllm":
        return {"OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return {"AGENTCACHE_NUM_THREADS": str(threads)}
