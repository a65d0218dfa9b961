"""Adapter pre-training of CoPE on a frozen model: LoRA on q/k/v/o plus the position tables.

The run is a pure function of (settings, step): window order comes from a seeded permutation
and the learning rate from the step, so a run resumed from a checkpoint continues exactly where
the interrupted one was (same windows, same optimizer moments, same step count).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from agentcache.cope.checkpoint import (
    AdapterError,
    adapter_from_payload,
    read_payload,
    save_adapter,
    training_history,
)
from agentcache.cope.data import Split
from agentcache.model.cope import CoPEAdapter, CoPEConfig, CoPEForward
from agentcache.model.llama import LlamaForward
from agentcache.model.loading import LoadedModel

# settings that must match to resume a checkpoint (steps may be extended)
_RESUME_KEYS = ("seq_len", "batch", "lr", "warmup", "seed", "cope")


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 500  # ~20 min at the 0.41 steps/s measured (1 thread, shared 2-core CPU)
    seq_len: int = 256
    batch: int = 1  # windows per optimizer step
    lr: float = 7e-4  # 2e-3 diverged after ~80 steps
    warmup: int = 20  # linear warm-up steps, then cosine decay to lr / 10
    checkpoint_every: int = 25
    eval_windows: int = 16
    seed: int = 0
    cope: CoPEConfig = field(default_factory=CoPEConfig)

    def __post_init__(self) -> None:
        if min(self.steps, self.seq_len, self.batch, self.checkpoint_every) < 1:
            raise ValueError("steps, seq_len, batch and checkpoint_every must be >= 1")
        if self.lr <= 0 or self.warmup < 0 or self.eval_windows < 1:
            raise ValueError("lr must be > 0, warmup >= 0, eval_windows >= 1")

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        done = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainSettings:
        return cls(**{**d, "cope": CoPEConfig(**d["cope"])})


@dataclass(frozen=True)
class TrainResult:
    steps: int
    resumed_from: int  # 0 for a fresh run
    train_seconds: float  # this invocation's training time (not evaluation)
    steps_per_second: float
    final_loss: float
    ppl_base: float  # the base (RoPE) model on the held-out windows
    ppl_untrained: float  # CoPE with the fresh adapter, before training
    ppl_trained: float
    held_out_tokens: int
    adapter_path: Path


def eval_windows(held_out: Tensor, n: int) -> Tensor:
    """`n` windows spread evenly over the held-out split (it is ordered by document, and the
    first documents are long essays: the first n windows would all be one essay)."""
    idx = torch.linspace(0, len(held_out) - 1, min(n, len(held_out))).round().long()
    return held_out[idx]


def perplexity(forward: LlamaForward, windows: Tensor) -> float:
    """exp(mean next-token cross-entropy) over (N, L) windows."""
    total, count = 0.0, 0
    with torch.no_grad():
        for w in windows:
            logits = forward.forward(w).logits
            total += float(F.cross_entropy(logits[:-1], w[1:], reduction="sum"))
            count += len(w) - 1
    return math.exp(total / count)


class Trainer:
    """Owns the adapter being trained, its optimizer and the step count."""

    def __init__(self, loaded: LoadedModel, settings: TrainSettings) -> None:
        self.loaded = loaded
        self.settings = settings
        self.adapter = CoPEAdapter.init(loaded.forward, settings.cope, seed=settings.seed)
        self._start()

    def _start(self) -> None:
        for p in self.adapter.parameters():
            p.requires_grad_(True)
        self.forward = CoPEForward(self.loaded.forward, self.adapter)
        self.optimizer = torch.optim.AdamW(self.adapter.parameters(), lr=self.settings.lr)
        self.step = 0
        self.history: list[tuple[int, float]] = []
        self.evals: dict[str, float] = {}

    def restore(self, path: Path) -> None:
        """Continue from checkpoint `path`; AdapterError if it is for another model or run."""
        payload = read_payload(path)
        try:
            saved = TrainSettings.from_dict(payload["train"])
        except (KeyError, TypeError, ValueError) as e:
            raise AdapterError(f"{path}: not a training checkpoint (train: {e!r:.80})") from None
        differ = [k for k in _RESUME_KEYS if getattr(saved, k) != getattr(self.settings, k)]
        if differ:
            raise AdapterError(f"{path} was written with other settings ({', '.join(differ)})")
        self.adapter = adapter_from_payload(payload, self.loaded, path)
        self._start()
        self.history, self.evals = training_history(payload, path)
        try:
            self.optimizer.load_state_dict(payload["optimizer"])
            self.step = int(payload["step"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise AdapterError(f"{path}: training state is malformed ({e!r:.80})") from None

    def checkpoint(self, path: Path) -> None:
        save_adapter(
            path,
            self.adapter,
            self.loaded.model_id,
            step=self.step,
            optimizer=self.optimizer.state_dict(),
            train=self.settings.as_dict(),
            history=[list(h) for h in self.history],
            evals=self.evals,
        )

    def train_step(self, windows: Tensor) -> float:
        """One optimizer step on the windows this step's index picks from `windows`."""
        s = self.settings
        order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(s.seed))
        picks = [int(order[(self.step * s.batch + b) % len(windows)]) for b in range(s.batch)]
        for group in self.optimizer.param_groups:
            group["lr"] = s.lr_at(self.step)
        loss_sum = 0.0
        for i in picks:
            w = windows[i]
            loss = F.cross_entropy(self.forward.forward(w).logits[:-1], w[1:]) / s.batch
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.adapter.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.history.append((self.step, loss_sum))
        return loss_sum


def train(
    loaded: LoadedModel,
    split: Split,
    settings: TrainSettings,
    checkpoint: Path,
    adapter_out: Path,
    resume: bool = False,
    on_step: Callable[[int, float], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train (or resume) to `settings.steps`, checkpointing every `checkpoint_every` steps and
    at the end, then save the adapter to `adapter_out` and measure held-out perplexity."""
    trainer = Trainer(loaded, settings)
    held_out = eval_windows(split.held_out, settings.eval_windows)
    phase = on_phase or (lambda _: None)
    if resume and checkpoint.is_file():
        trainer.restore(checkpoint)
    resumed_from = trainer.step
    if not trainer.evals:
        phase("perplexity before training")
        trainer.evals["base"] = perplexity(loaded.forward, held_out)
        trainer.evals["untrained"] = perplexity(trainer.forward, held_out)
    t0 = time.perf_counter()
    loss = trainer.history[-1][1] if trainer.history else float("nan")
    while trainer.step < settings.steps:
        loss = trainer.train_step(split.train)
        if on_step:
            on_step(trainer.step, loss)
        if trainer.step % settings.checkpoint_every == 0 or trainer.step == settings.steps:
            trainer.checkpoint(checkpoint)
    seconds = time.perf_counter() - t0
    phase("perplexity after training")
    trainer.evals["trained"] = perplexity(trainer.forward, held_out)
    trainer.checkpoint(checkpoint)
    save_adapter(
        adapter_out,
        trainer.adapter,
        loaded.model_id,
        train=settings.as_dict(),
        evals=trainer.evals,
        step=trainer.step,
    )
    done = trainer.step - resumed_from
    return TrainResult(
        steps=trainer.step,
        resumed_from=resumed_from,
        train_seconds=seconds,
        steps_per_second=done / seconds if seconds > 0 else 0.0,
        final_loss=loss,
        ppl_base=trainer.evals["base"],
        ppl_untrained=trainer.evals["untrained"],
        ppl_trained=trainer.evals["trained"],
        held_out_tokens=int(held_out.numel()),
        adapter_path=adapter_out,
    )
