"""Reading a local Hugging Face checkpoint's safetensors for a model family, checked.

Every tensor is read by name from the folder's *.safetensors files and checked against what
the family's config implies before any forward exists: a name the family does not know, a
tensor it needs that no file holds, a shape that does not match the config, or a dtype that is
not a float (a quantized checkpoint) is a `ModelLoadError` naming the file and the tensor.
fp16 / bf16 / fp32 weights are converted to fp32, the precision the forward runs in.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from agentcache.errors import ModelLoadError
from agentcache.model.config import ModelConfig
from agentcache.model.families.base import OPTIONAL_ROLES, ModelFamily

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# tensors some checkpoints carry that the forward recomputes (RoPE tables of older exports)
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def role_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every `LayerWeights` role under config `c`."""
    d, i, dh = c.hidden_size, c.intermediate_size, c.head_dim
    q, kv = c.num_heads * dh, c.num_kv_heads * dh
    return {
        "input_norm": (d,), "post_norm": (d,), "attn_out_norm": (d,), "ff_out_norm": (d,),
        "wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q),
        "bq": (q,), "bk": (kv,), "bv": (kv,), "q_norm": (dh,), "k_norm": (dh,),
        "w_gate": (i, d), "w_up": (i, d), "w_down": (d, i),
        "wqkv": (q + 2 * kv, d), "w_gate_up": (2 * i, d),  # fused (Phi-3)
    }  # fmt: skip


def expected_tensors(c: ModelConfig, family: ModelFamily) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape, for every tensor the family reads."""
    shapes = role_shapes(c)
    out = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
           "model.norm.weight": (c.hidden_size,),
           "lm_head.weight": (c.vocab_size, c.hidden_size)}  # fmt: skip
    for layer in range(c.num_layers):
        for role, name in family.names.items():
            out[f"model.layers.{layer}.{name}"] = shapes[role]
    return out


def optional_tensors(c: ModelConfig, family: ModelFamily) -> set[str]:
    names = {f"model.layers.{i}.{family.names[r]}" for i in range(c.num_layers)
             for r in OPTIONAL_ROLES & family.names.keys()}  # fmt: skip
    return names | ({"lm_head.weight"} if c.tie_word_embeddings else set())


def read_safetensors(folder: Path, config: ModelConfig, family: ModelFamily) -> dict[str, Tensor]:
    """Every tensor `family` reads, fp32, from `folder`'s *.safetensors, checked (see module)."""
    from safetensors import SafetensorError, safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        found = ", ".join(sorted(p.name for p in folder.iterdir() if p.is_file())) or "nothing"
        raise ModelLoadError(
            f"could not load {folder}: it holds no *.safetensors weights (found: {found}); "
            "save the model with save_pretrained(..., safe_serialization=True)"
        )
    want = expected_tensors(config, family)
    out: dict[str, Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if name.endswith(IGNORED_SUFFIXES):
                        continue
                    if name not in want:
                        raise ModelLoadError(
                            f"{path}: tensor {name!r} is not one the {family.name} family reads "
                            f"({config.model_type}); is the checkpoint of another architecture?"
                        )
                    out[name] = _checked(path, name, f.get_tensor(name), want[name])
        except (SafetensorError, OSError) as e:  # a header or length that does not parse
            raise ModelLoadError(
                f"{path} is not a readable safetensors file ({e}); is it truncated or corrupted?"
            ) from e
    missing = sorted(set(want) - set(out) - optional_tensors(config, family))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelLoadError(
            f"{folder}: the weights lack {', '.join(missing[:3])}{more}, which "
            f"{folder / 'config.json'} implies ({family.name} family, {config.num_layers} layers)"
        )
    return out


def _checked(path: Path, name: str, t: Tensor, shape: tuple[int, ...]) -> Tensor:
    if t.dtype not in FLOAT_DTYPES:
        raise ModelLoadError(
            f"{path}: tensor {name!r} is {t.dtype}; agentcache loads fp32, fp16 or bf16 weights "
            "(integer-quantized, fp8 and fp64 tensors are not supported)"
        )
    if tuple(t.shape) != shape:
        raise ModelLoadError(
            f"{path}: tensor {name!r} has shape {tuple(t.shape)} but config.json implies {shape}"
        )
    return t.to(torch.float32)
