"""Head-stability profiles: Random-Corrected Overlap (RCO) of top-K page sets over decode steps,
saved per model as JSON.

For a (layer, KV head), a 16-step window compares each step's top-K set B with the set A of the
window's first step:

    overlap = |A & B| / K,  random = K / N_pages,  RCO = max(0, (overlap - random) / (1 - random))

stability = mean RCO over every compared step of every window and prompt. The least stable
`unstable_fraction` of heads form the unstable set.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentcache.errors import ProfileError

FORMAT = "agentcache-head-profile/1"
DEFAULT_WINDOW = 16
DEFAULT_UNSTABLE_FRACTION = 0.25


def rco(a: Tensor, b: Tensor, num_candidates: int) -> Tensor:
    """RCO of top-K sets a, b (..., K) of page ids (-1 = none) drawn from `num_candidates`."""
    k = a.shape[-1]
    random = k / num_candidates
    if random >= 1.0:
        raise ValueError(f"top-{k} of {num_candidates} pages overlaps fully by chance; need K < N")
    hit = ((a[..., :, None] == b[..., None, :]) & (a[..., :, None] >= 0)).any(-1)
    overlap = hit.sum(-1).to(torch.float64) / k
    return ((overlap - random) / (1.0 - random)).clamp(min=0.0)


def window_rco(sets: Tensor, num_candidates: list[int], window: int) -> Tensor:
    """Mean RCO per head over `window`-step windows: sets (S, ..., K) -> (...).

    Step s of a window starting at s0 is compared with step s0; steps after the last full
    window's start still compare with it. num_candidates[s] is N_pages at step s."""
    total = torch.zeros(sets.shape[1:-1], dtype=torch.float64)
    count = 0
    for s in range(sets.shape[0]):
        s0 = s - s % window
        if s == s0:
            continue
        total += rco(sets[s0], sets[s], num_candidates[s])
        count += 1
    if count == 0:
        raise ValueError(f"need more than one decode step per {window}-step window")
    return total / count


@dataclass(frozen=True)
class HeadProfile:
    model_id: str
    num_layers: int
    num_kv_heads: int
    stability: list[list[float]]  # [layer][kv head], mean RCO over DEFAULT_WINDOW-step windows
    unstable: list[tuple[int, int]]  # (layer, kv head), least stable first
    rco_by_window: dict[str, list[list[float]]] = field(default_factory=dict)  # "4", "64", ...
    gqa_recall: dict[str, float] = field(default_factory=dict)  # attention mass kept per combine
    settings: dict[str, Any] = field(default_factory=dict)

    def stability_tensor(self) -> Tensor:
        return torch.tensor(self.stability, dtype=torch.float64)

    def unstable_mask(self) -> Tensor:
        mask = torch.zeros(self.num_layers, self.num_kv_heads, dtype=torch.bool)
        for layer, head in self.unstable:
            mask[layer, head] = True
        return mask

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1)


def unstable_set(stability: Tensor, fraction: float) -> list[tuple[int, int]]:
    """The least stable `fraction` of heads (rounded to nearest, at least one if fraction > 0)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"unstable fraction must be in [0, 1], got {fraction}")
    n = stability.numel()
    count = max(1, round(fraction * n)) if fraction > 0 else 0
    order = torch.argsort(stability.flatten(), stable=True)[:count]
    hkv = stability.shape[1]
    return [(int(i) // hkv, int(i) % hkv) for i in order]


def profile_filename(model_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model_id) + ".json"


def save_profile(profile: HeadProfile, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(profile.to_json())
    tmp.replace(path)
    return path


def load_profile(path: Path, model_id: str, num_layers: int, num_kv_heads: int) -> HeadProfile:
    """Read and validate a profile for `model_id`; anything wrong raises ProfileError."""
    if not path.is_file():
        raise ProfileError(
            f"no head profile for model {model_id} at {path}; "
            "run `agentcache profile-heads` for this model"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or raw.pop("format", None) != FORMAT:
            raise ValueError(f"not an {FORMAT} file")
        raw["unstable"] = [tuple(x) for x in raw["unstable"]]
        profile = HeadProfile(**raw)
    except (ValueError, TypeError, KeyError, OSError) as e:
        raise ProfileError(
            f"head profile {path} is corrupted ({e}); expected a profile for model {model_id}; "
            "rerun `agentcache profile-heads`"
        ) from e
    if profile.model_id != model_id:
        raise ProfileError(
            f"head profile {path} is for model {profile.model_id}, not {model_id}; "
            "profile this model with `agentcache profile-heads`"
        )
    _check_shape(profile, path, num_layers, num_kv_heads)
    return profile


def _check_shape(profile: HeadProfile, path: Path, num_layers: int, num_kv_heads: int) -> None:
    shape = (num_layers, num_kv_heads)
    stab = profile.stability
    ok = (
        (profile.num_layers, profile.num_kv_heads) == shape
        and len(stab) == num_layers
        and all(len(row) == num_kv_heads for row in stab)
        and all(isinstance(x, int | float) and 0.0 <= x <= 1.0 for row in stab for x in row)
        and all(len(u) == 2 for u in profile.unstable)
        and all(0 <= la < num_layers and 0 <= h < num_kv_heads for la, h in profile.unstable)
    )
    if not ok:
        raise ProfileError(
            f"head profile {path} for model {profile.model_id} is corrupted: expected "
            f"{num_layers} layers x {num_kv_heads} KV heads of stability scores in [0, 1]"
        )
