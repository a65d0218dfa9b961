"""SmolLM3: the Llama layer with NoPE layers. `no_rope_layers[i]` is 1 where layer i rotates
q/k and 0 where it does not (by default every fourth layer): those layers' keys carry no
position, so re-rotation leaves them as they are."""

from __future__ import annotations

from typing import Any

from agentcache.model.attention import GLOBAL_ROTARY
from agentcache.model.families.base import ModelFamily, Structure, llama_like


class SmolLM3Family(ModelFamily):
    name = "smollm3"
    model_types = ("smollm3",)

    def structure(self, hf: Any) -> Structure:
        rotates = list(hf.no_rope_layers)
        if len(rotates) != hf.num_hidden_layers:
            raise self.refuse(
                f"no_rope_layers of {len(rotates)} entries",
                f"the model has {hf.num_hidden_layers} layers",
            )
        return llama_like(hf, rotary=lambda i: GLOBAL_ROTARY if rotates[i] else None)
