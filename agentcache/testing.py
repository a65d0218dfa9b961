"""Helpers for tests, examples and benchmarks: tiny random models (seeded, built in-process, no
files) and `ServeProcess`, a real `agentcache serve` in a subprocess."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import torch

from agentcache.model.loading import LoadedModel, from_hf
from agentcache.model.tokenizer import ByteTokenizer


def tiny_hf_model(
    model_type: str = "llama",
    seed: int = 0,
    rope_parameters: dict[str, Any] | None = None,
    num_layers: int = 4,
    max_positions: int = 4096,
) -> Any:
    """A seeded random `transformers` model with a 260-token byte vocabulary."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=260,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_positions,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the init default, so attention is not uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model.eval()


def tiny_model(model_type: str = "llama", seed: int = 0, **kw: Any) -> LoadedModel:
    return from_hf(tiny_hf_model(model_type, seed, **kw), ByteTokenizer(), f"tiny-{model_type}")


def scripted_sampler(text: str) -> Callable[..., int]:
    """A stand-in for `runtime.sampling.sample` on `tiny_model`'s byte tokenizer: it picks the
    bytes of `text`, then end of text, turn after turn, whatever the logits. The engine still
    computes every token's KV; tests use it where a random model's output would not round-trip
    through text."""
    queue: list[int] = []

    def sample(logits: torch.Tensor, *args: object) -> int:
        if not queue:
            queue.extend([*text.encode(), ByteTokenizer.EOS])
        return queue.pop(0)

    return sample


TINY_FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    # one tiny config per registered family and variant, built with transformers' own classes
    "llama3": {"model_type": "llama", "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "qwen2": {"model_type": "qwen2"},
    "qwen2-window": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 24,
                     "max_window_layers": 2},  # layers 2, 3 slide; 0, 1 attend globally
    "qwen3": {"model_type": "qwen3"},
    "mistral": {"model_type": "mistral", "sliding_window": 24},
    "smollm3": {"model_type": "smollm3", "pad_token_id": 0, "bos_token_id": None,
                "eos_token_id": None},
    "gemma3": {"model_type": "gemma3_text", "sliding_window": 24, "query_pre_attn_scalar": 24,
               "final_logit_softcapping": 30.0, "layer_types": [
                   "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
               "rope_parameters": {
                   "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    "phi3": {"model_type": "phi3", "sliding_window": 24, "pad_token_id": 0, "bos_token_id": None,
             "eos_token_id": None, "rope_parameters": {
                 "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
    "ministral": {"model_type": "ministral", "sliding_window": 24, "layer_types": [
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"]},
}  # fmt: skip


def tiny_family_hf_model(variant: str, seed: int = 0, **overrides: Any) -> Any:
    """A seeded random `transformers` model of `TINY_FAMILY_CONFIGS[variant]`: 4 layers, 4 query
    and 2 KV heads of 16 dims, a 260-token byte vocabulary, norms and biases randomised too
    (so a skipped q/k norm shows)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {**TINY_FAMILY_CONFIGS[variant], **overrides}
    config = AutoConfig.for_model(
        kw.pop("model_type"),
        vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=1024, tie_word_embeddings=False, **kw,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
            else:
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def tiny_family_model(variant: str, seed: int = 0) -> LoadedModel:
    hf = tiny_family_hf_model(variant, seed)
    return from_hf(hf, ByteTokenizer(), f"tiny-{variant}")


def free_port() -> int:
    """A loopback port free now (another process may take it before it is bound again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopbackProcess:
    """A server command started on a free loopback port (`argv(port)`), ready once its
    `/health` answers 200; its command line and output appended to `log`. RuntimeError, naming
    the log, when it exits or stays unready for `start_timeout_s`. Closing terminates it (kills
    it after 60 s); use it as a context manager or call `close()`."""

    def __init__(
        self,
        name: str,
        argv: Callable[[int], list[str]],
        log: Path,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = argv(self.port)
        self.log = log
        self._log: IO[str] = log.open("a")
        self._log.write(f"\n$ {shlex.join(self.argv)}\n")
        self._log.flush()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc = subprocess.Popen(self.argv, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        try:
            self._wait_ready(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"its output is in {self.log}")  # fmt: skip
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=10) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not answer /health within {timeout_s:.0f} s; "
                           f"its output is in {self.log}")  # fmt: skip

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ServeProcess(LoopbackProcess):
    """`python -m agentcache serve ARGS` on a free loopback port, in a subprocess of this Python
    (`LoopbackProcess`). `url` is the server's root, `base_url` its OpenAI-style `/v1`. The
    server's output goes to `log` (appended), or to a temporary file that is kept when the
    server fails to start, so the error can name it."""

    def __init__(
        self,
        args: Sequence[str] = (),
        log: Path | None = None,
        model_name: str = "agentcache-default",
        start_timeout_s: float = 300.0,
    ) -> None:
        self.model_name = model_name
        if log is None:
            fd, name = tempfile.mkstemp(prefix="agentcache-serve-", suffix=".log")
            os.close(fd)
            log = Path(name)

        def argv(port: int) -> list[str]:
            return [sys.executable, "-m", "agentcache", "serve", "--port", str(port),
                    "--served-model-name", model_name, *args]  # fmt: skip

        super().__init__("agentcache serve", argv, log, start_timeout_s=start_timeout_s)
        self.base_url = f"{self.url}/v1"
