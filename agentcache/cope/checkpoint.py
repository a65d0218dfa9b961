"""CoPE adapter files: checksummed, written atomically, keyed by the base model's id.

File layout:  MAGIC (8 bytes) | sha256 of the payload (32 bytes) | payload (torch.save of a dict
of plain values and tensors, read back with weights_only=True). A truncated or altered file
fails the length or checksum check and raises `AdapterError`: it is never loaded.
Payload keys: format, model_id (the base model the adapter was trained on), config (CoPEConfig
fields), tensors (the adapter's state dict) and, in training checkpoints, step, optimizer,
train (the training settings) and history.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from agentcache.errors import ModelLoadError
from agentcache.fsutil import write_atomic
from agentcache.model.cope import CoPEAdapter, CoPEConfig, CoPEForward
from agentcache.model.loading import (
    LoadedModel,
    default_cache_dir,
    ensure_writable,
    tensors_digest,
)

MAGIC = b"ACCOPE01"
FORMAT = "agentcache-cope/1"
_HEADER = len(MAGIC) + 32


class AdapterError(ModelLoadError):
    """A CoPE adapter or checkpoint is missing, corrupted, or for another model."""


def adapter_path(cache_dir: Path, model_id: str) -> Path:
    """Where the trained adapter of `model_id` lives under the cache folder."""
    return cache_dir / "cope" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', model_id)}.adapter"


def write_payload(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically: a temporary file in the same folder, fsynced, then renamed."""
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **payload}, buf)
    data = buf.getvalue()
    ensure_writable(path.parent)
    write_atomic(path, [MAGIC, hashlib.sha256(data).digest(), data])


def read_payload(path: Path) -> dict[str, Any]:
    """Read and verify a file written by `write_payload`; AdapterError if it is not intact."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise AdapterError(f"no CoPE adapter at {path}") from None
    if len(raw) < _HEADER or raw[: len(MAGIC)] != MAGIC:
        raise AdapterError(f"{path} is not a CoPE adapter file (bad header or truncated)")
    data = raw[_HEADER:]
    if hashlib.sha256(data).digest() != raw[len(MAGIC) : _HEADER]:
        raise AdapterError(f"{path} is corrupted or partially written: checksum mismatch")
    try:
        payload = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # a checksummed payload of anything: an unpickler error of any kind
        raise AdapterError(f"{path}: the payload does not load ({type(e).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise AdapterError(f"{path}: unknown format {str(got)[:60]!r}, want {FORMAT}")
    return payload


def save_adapter(path: Path, adapter: CoPEAdapter, model_id: str, **extra: Any) -> None:
    tensors = {k: v.detach().clone() for k, v in adapter.state_dict().items()}
    config = asdict(adapter.config)
    write_payload(path, {"model_id": model_id, "config": config, "tensors": tensors, **extra})


def adapter_from_payload(payload: dict[str, Any], loaded: LoadedModel, path: Path) -> CoPEAdapter:
    """The adapter in `payload`, checked against the model it will run on: its model id, a
    configuration the model can hold, and every tensor present, float32, finite and of the
    shape this model's adapter has. Anything else is an AdapterError naming the file."""
    model_id = payload.get("model_id")
    if model_id != loaded.model_id:
        raise AdapterError(
            f"{path} holds a CoPE adapter trained for model {str(model_id)[:200]!r}; it cannot "
            f"be loaded on model {loaded.model_id!r}"
        )
    adapter = CoPEAdapter.init(loaded.forward, _config(payload.get("config"), loaded, path))
    tensors = payload.get("tensors")
    if not isinstance(tensors, dict):
        raise AdapterError(f"{path}: tensors must be a dict of named tensors")
    for name, t in tensors.items():
        _check_tensor(name, t, path)
    try:
        adapter.load_state_dict(tensors)
    except ValueError as e:
        raise AdapterError(f"{path}: {e}") from e
    return adapter


def _config(raw: Any, loaded: LoadedModel, path: Path) -> CoPEConfig:
    types: dict[str, type | tuple[type, ...]] = {
        "max_position": int,
        "keep_rope": bool,
        "rank": int,
        "alpha": (int, float),
    }
    if not isinstance(raw, dict) or set(raw) - set(types):
        raise AdapterError(f"{path}: config must be a dict of {sorted(types)}")
    for key, value in raw.items():
        if not isinstance(value, types[key]) or (key != "keep_rope" and isinstance(value, bool)):
            raise AdapterError(f"{path}: config {key} = {str(value)[:40]!r} has the wrong type")
    try:
        config = CoPEConfig(**raw)
    except ValueError as e:
        raise AdapterError(f"{path}: config: {e}") from None
    c = loaded.config
    if config.max_position > c.max_position_embeddings or config.rank > c.hidden_size:
        raise AdapterError(
            f"{path}: config max_position {config.max_position} / rank {config.rank} exceed "
            f"the model's {c.max_position_embeddings} positions / {c.hidden_size} hidden size"
        )
    return config


def _check_tensor(name: Any, t: Any, path: Path) -> None:
    if not isinstance(name, str) or not isinstance(t, torch.Tensor):
        raise AdapterError(f"{path}: tensor {str(name)[:60]!r} is not a named tensor")
    if t.dtype != torch.float32:
        raise AdapterError(f"{path}: tensor {name} is {t.dtype}, adapters are float32")
    if not bool(torch.isfinite(t).all()):
        raise AdapterError(f"{path}: tensor {name} holds NaN or infinite values")


def training_history(
    payload: dict[str, Any], path: Path
) -> tuple[list[tuple[int, float]], dict[str, float]]:
    """A training checkpoint's loss per step and held-out perplexities."""
    try:
        history = [(int(s), float(x)) for s, x in payload["history"]]
        evals = {str(k): float(v) for k, v in payload["evals"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise AdapterError(f"{path}: training history is malformed ({e!r:.80})") from None
    return history, evals


def with_adapter(loaded: LoadedModel, adapter: CoPEAdapter) -> LoadedModel:
    """`loaded` running CoPE attention; its model id names the adapter, so cache entries of
    the base model and of the adapted one never mix."""
    cope_id = f"{loaded.model_id}+cope-{tensors_digest(adapter.state_dict())}"
    return replace(loaded, forward=CoPEForward(loaded.forward, adapter), model_id=cope_id)


def load_cope_adapter(
    loaded: LoadedModel, path: Path | None = None, cache_dir: Path | None = None
) -> LoadedModel:
    """`loaded` with its trained CoPE adapter (by default the one saved for its model id under
    the cache folder). AdapterError if the file is missing, corrupted or for another model."""
    if isinstance(loaded.forward, CoPEForward):
        raise AdapterError(f"model {loaded.model_id!r} already runs a CoPE adapter")
    path = path or adapter_path(cache_dir or default_cache_dir(), loaded.model_id)
    if not path.is_file():
        raise AdapterError(
            f"no CoPE adapter for model {loaded.model_id!r} at {path}; train one with "
            "`agentcache train-cope`"
        )
    payload = read_payload(path)
    return with_adapter(loaded, adapter_from_payload(payload, loaded, path))
