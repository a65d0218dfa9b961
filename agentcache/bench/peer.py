"""`transformers-prefix`: the exact-prefix reuse a user would hand-roll with `transformers`,
measured in the bench beside the strategies, on the same weights, token ids and threads.

    previous request:  [ ids the cache holds ........................ ]
    new prompt:        [ longest common token prefix | rest .............. ]
                         kept (the cache is cropped)   prefilled by the HF model

At least the prompt's last token is computed, as every strategy does (it yields the first
token). It is exact: its logits are a full prefill's up to float noise.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentcache.errors import ConfigError

PEER = "transformers-prefix"


def load_peer_model(folder: Path) -> Any:
    """The HF causal LM of a checkpoint folder, fp32 (as agentcache's own forward loads it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class TransformersPrefix:
    """One session's hand-rolled cache: the previous request's `DynamicCache` and its ids."""

    def __init__(self, hf_model: Any) -> None:
        from agentcache.model.families.base import layer_windows

        if any(w is not None for w in layer_windows(hf_model.config)):
            raise ConfigError(
                f"{PEER} cannot run {hf_model.config.model_type} with sliding-window layers: "
                "transformers' cache keeps only a window's last tokens there and cannot be "
                "cropped back to a shorter prefix"
            )
        self.model = hf_model
        params = inspect.signature(hf_model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in 5.x
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new session)."""
        from transformers import DynamicCache

        self.cache: Any = DynamicCache(config=self.model.config)  # its layers' types vary
        self.ids: list[int] = []

    def prefill(self, ids: Sequence[int]) -> tuple[Tensor, int]:
        """Crop the cache to the longest common prefix with `ids`, prefill the rest. Returns the
        logits after the last token (V,) and the number of tokens reused."""
        keep = common_prefix(self.ids, ids[:-1])
        self._crop(keep)
        return self._forward(ids[keep:]), keep

    def step(self, token: int) -> Tensor:
        """Append one token; the logits after it (V,)."""
        return self._forward([token])

    def extend_to(self, prompt_ids: Sequence[int], after: Sequence[int]) -> None:
        """Hold `prompt_ids` then `after` (e.g. a reply as if generated), computing `after`."""
        self._crop(common_prefix(self.ids, prompt_ids))
        rest = [*prompt_ids[len(self.ids) :], *after]
        if rest:
            self._forward(rest)

    def keys(self, num_tokens: int) -> Tensor:
        """The first `num_tokens` tokens' keys, (L, T, H, D) as `SequenceKV.gather_all`."""
        return torch.stack([layer.keys[0, :, :num_tokens].transpose(0, 1) for layer in
                            self.cache.layers])  # fmt: skip

    def cache_bytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for layer in self.cache.layers
            for t in (layer.keys, layer.values)
        )  # fmt: skip

    def _crop(self, keep: int) -> None:
        if keep < len(self.ids):
            self.cache.crop(keep - len(self.ids))  # a negative count: tokens to remove
            del self.ids[keep:]

    def _forward(self, ids: Sequence[int]) -> Tensor:
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.tensor([list(ids)]), use_cache=True, logits_to_keep=1,
                **{self._cache_arg: self.cache},
            )  # fmt: skip
        self.ids.extend(ids)
        return out.logits[0, -1].float()
