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


REQUIRED_KEYS = ("model_id", "num_layers", "num_kv_heads", "stability", "unstable")


def load_profile(path: Path, model_id: str, num_layers: int, num_kv_heads: int) -> HeadProfile:
    """Read and validate a profile for `model_id`; anything wrong raises ProfileError naming it."""
    if not path.is_file():
        raise ProfileError(
            f"no head profile for model {model_id} at {path}; "
            "run `agentcache profile-heads` for this model"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise _corrupted(path, model_id, f"not JSON ({e})") from e
    problem = _format_problem(raw)
    if problem is None and raw["model_id"] != model_id:
        raise ProfileError(
            f"head profile {path} is for model {raw['model_id']}, not {model_id}; "
            "profile this model with `agentcache profile-heads`"
        )
    problem = problem or _shape_problem(raw, num_layers, num_kv_heads)
    if problem is not None:
        raise _corrupted(path, model_id, problem)
    del raw["format"]
    raw["unstable"] = [tuple(u) for u in raw["unstable"]]
    try:
        return HeadProfile(**raw)
    except TypeError as e:
        raise _corrupted(path, model_id, f"unexpected content ({e})") from e


def _corrupted(path: Path, model_id: str, problem: str) -> ProfileError:
    return ProfileError(
        f"head profile {path} is corrupted: {problem}; expected a profile for model "
        f"{model_id}; rerun `agentcache profile-heads`"
    )


def _format_problem(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return f"not a JSON object but a {type(raw).__name__}"
    if raw.get("format") != FORMAT:
        return f"not an {FORMAT} file (format {raw.get('format')!r})"
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    return f"missing key(s) {', '.join(missing)}" if missing else None


def _shape_problem(raw: dict[str, Any], num_layers: int, num_kv_heads: int) -> str | None:
    shape = f"{num_layers} layers x {num_kv_heads} KV heads"
    if (raw["num_layers"], raw["num_kv_heads"]) != (num_layers, num_kv_heads):
        return f"its shape is {raw['num_layers']} x {raw['num_kv_heads']}, the model's {shape}"
    stab = raw["stability"]
    if not (isinstance(stab, list) and len(stab) == num_layers
            and all(isinstance(r, list) and len(r) == num_kv_heads for r in stab)):  # fmt: skip
        return f"stability is not {num_layers} rows of {num_kv_heads} scores"
    for layer, row in enumerate(stab):
        for head, x in enumerate(row):
            if not _is_score(x):
                return f"stability[{layer}][{head}] = {x!r} is not a number in [0, 1]"
    return _unstable_problem(raw["unstable"], num_layers, num_kv_heads)


def _is_score(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and 0.0 <= x <= 1.0


def _unstable_problem(unstable: Any, num_layers: int, num_kv_heads: int) -> str | None:
    if not isinstance(unstable, list):
        return f"unstable is a {type(unstable).__name__}, not a list of (layer, KV head) pairs"
    for u in unstable:
        pair = isinstance(u, list) and len(u) == 2
        if not (pair and all(isinstance(i, int) and not isinstance(i, bool) for i in u)):
            return f"unstable entry {u!r} is not a (layer, KV head) pair of integers"
        if not (0 <= u[0] < num_layers and 0 <= u[1] < num_kv_heads):
            return (f"unstable head {u!r} is out of range for {num_layers} layers x "
                    f"{num_kv_heads} KV heads")  # fmt: skip
    return None
