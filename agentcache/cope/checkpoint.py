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
import os
import re
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from agentcache.errors import ModelLoadError
from agentcache.model.cope import CoPEAdapter, CoPEConfig, CoPEForward
from agentcache.model.loading import LoadedModel, default_cache_dir, ensure_writable

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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(data).digest() + data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    payload = torch.load(io.BytesIO(data), weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise AdapterError(f"{path}: unknown format {payload.get('format')!r}, want {FORMAT}")
    return payload


def save_adapter(path: Path, adapter: CoPEAdapter, model_id: str, **extra: Any) -> None:
    tensors = {k: v.detach().clone() for k, v in adapter.state_dict().items()}
    config = asdict(adapter.config)
    write_payload(path, {"model_id": model_id, "config": config, "tensors": tensors, **extra})


def adapter_from_payload(payload: dict[str, Any], loaded: LoadedModel, path: Path) -> CoPEAdapter:
    """The adapter in `payload`, checked against the model it will run on."""
    if payload["model_id"] != loaded.model_id:
        raise AdapterError(
            f"{path} holds a CoPE adapter trained for model {payload['model_id']!r}; it cannot "
            f"be loaded on model {loaded.model_id!r}"
        )
    adapter = CoPEAdapter.init(loaded.forward, CoPEConfig(**payload["config"]))
    try:
        adapter.load_state_dict(payload["tensors"])
    except ValueError as e:
        raise AdapterError(f"{path}: {e}") from e
    return adapter


def with_adapter(loaded: LoadedModel, adapter: CoPEAdapter) -> LoadedModel:
    """`loaded` running CoPE attention; its model id names the adapter, so cache entries of
    the base model and of the adapted one never mix."""
    h = hashlib.blake2b(digest_size=4)
    for t in adapter.parameters()[:16]:
        h.update(t.detach().flatten()[:1024].numpy().tobytes())
    cope_id = f"{loaded.model_id}+cope-{h.hexdigest()}"
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
