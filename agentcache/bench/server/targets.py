"""The servers a replay runs against, each in a process of its own on a free loopback port.

| target            | process                                                          |
|-------------------|------------------------------------------------------------------|
| `embedded`        | `agentcache serve` (the default strategy)                        |
| `embedded-prefix` | `agentcache serve --strategy prefix` (exact prefix caching)      |
| `vllm-backend`    | `agentcache serve --backend vllm`, in the vLLM venv's Python     |
| `vllm`            | plain `vllm serve --enable-prefix-caching` on the same model folder |

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
from dataclasses import dataclass
from pathlib import Path

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
class TargetOptions:
    """How targets start: `model` is `tiny`, `default` or a model folder; `vllm_python` the
    vLLM venv's interpreter; `vllm_extra` more `vllm serve`
    arguments (its tool-call parser); `threads` torch threads of the agentcache servers;
    `model_folder` the folder plain vLLM loads (the converted default model for `default`)."""

    model: str = "default"
    vllm_python: str | None = None
    vllm_extra: str = DEFAULT_VLLM_EXTRA
    threads: int = 1
    model_folder: str | None = None


# scripts, not modules of the bench: the bench does not import the server (pyproject's layers)
TINY_SERVE = Path(__file__).resolve().parents[3] / "benchmarks" / "server" / "tiny_serve.py"
# `vllm serve` for vLLM's CPU wheel, whose own `vllm` script cannot find its version
VLLM_SERVE = TINY_SERVE.with_name("vllm_serve.py")


def command(target: str, port: int, o: TargetOptions) -> list[str]:
    """The command line that serves `target` on 127.0.0.1:`port`. ValueError for a target
    these options cannot start."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose from {', '.join(TARGETS)}")
    if o.model == "tiny":
        if target.startswith("vllm"):
            raise ValueError(f"target {target} needs a model folder, not the tiny model")
        return [sys.executable, str(TINY_SERVE), "--port", str(port),
                "--served-model-name", SERVED_NAME, *AGENTCACHE_ARGS[target]]  # fmt: skip
    if target.startswith("vllm") and o.vllm_python is None:
        raise ValueError(f"target {target} needs --vllm-python (the vLLM venv's interpreter)")
    if target == "vllm":
        if o.model_folder is None:
            raise ValueError("target vllm needs the model folder")
        return [str(o.vllm_python), str(VLLM_SERVE), "serve", o.model_folder, "--host",
                "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME,
                *VLLM_ENGINE_ARGS, *shlex.split(o.vllm_extra)]  # fmt: skip
    python = str(o.vllm_python) if target == "vllm-backend" else sys.executable
    model = [] if o.model == "default" else ["--model", o.model]
    return [python, "-m", "agentcache", "serve", "--port", str(port), "--served-model-name",
            SERVED_NAME, "--threads", str(o.threads), *model, *AGENTCACHE_ARGS[target]]  # fmt: skip


class ServerProcess(LoopbackProcess):
    """`target` started on a free loopback port (`agentcache.testing.LoopbackProcess`), its
    output appended to `log`."""

    def __init__(self, target: str, options: TargetOptions, log: Path,
                 start_timeout_s: float = 900.0) -> None:  # fmt: skip
        self.target = target
        super().__init__(target, lambda port: command(target, port, options), log,
                         thread_env(target, options.threads), start_timeout_s)  # fmt: skip


def thread_env(target: str, threads: int) -> dict[str, str]:
    """Every target gets `threads` threads: agentcache's servers through
    AGENTCACHE_NUM_THREADS; plain vLLM through OMP_NUM_THREADS with its CPU binding off (by
    default it binds OpenMP threads to cores of its own choosing, on a machine whose cores
    the other processes of the run share)."""
    if target == "vllm":
        return {"OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return {"AGENTCACHE_NUM_THREADS": str(threads)}
