"""Decode configuration: which placement/rerank policy, the page budget, and the head profile."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcache.decode.minmax import GQA_COMBINES
from agentcache.fieldtypes import check_field_types

DEFAULT_BUDGET_PAGES = 64  # 1024 tokens per KV head


@dataclass(frozen=True)
class DecodeConfig:
    """`policy` names a registered decode policy; `dense` is the engine's plain paged decode.

    budget_pages: top-K pages per KV head besides the sink page and the newest pages. Zero or
    less is rejected here; a budget larger than a sequence's context is clamped to it, with a
    warning, and reported (`DecodeStats.budget_clamped`).
    profile: a head-profile JSON (a Path, str or os.PathLike; kept as a Path); None means
    `<profile_dir>/<model id>.json`, with profile_dir defaulting to `<agentcache cache
    dir>/profiles`.
    verify: draft length of greedy self-speculative decoding, 0 = off. The sparse decoder
    drafts up to `verify` tokens, then one dense pass over them (every page, the offloaded
    heads' from the host tier) keeps the drafted tokens dense decoding agrees with and the
    token dense picks where they part, and rewrites their K/V with the dense values, so the
    output is dense decoding's. Sampling (temperature > 0) and a token constraint (structured
    outputs, logprobs: the verified tokens would bypass it) decode unverified, reported in
    `DecodeStats.verify_skipped`.
    top_p: the per-head budget adapts to the attention mass it must cover: at a rerank a head
    keeps, of its top `budget_pages` pages, the fewest whose share of the softmax over every
    rankable page's score bound reaches `top_p` (1.0: all of them, a fixed top-K). The fast tier
    keeps `budget_pages` slots per offloaded head either way.
    policy_options: keyword arguments of the policy's constructor; a spec sets the ones in the
    policy's `options` (`streaming:window=16`).
    dense_fallback: when the profile is missing, corrupted or for another model, decode densely
    (counted in TurnStats.decode_fallbacks) instead of raising ProfileError.
    short_dense: a turn too short for the policy to leave out any page (its prompt and new
    tokens fit the budget, so its sparse decoder would attend every page and offload none)
    decodes densely, counted in TurnStats.decode_fallbacks with the reason; False builds the
    sparse decoder anyway (the reference the sparse machinery's tests run).
    """

    policy: str = "dense"
    budget_pages: int = DEFAULT_BUDGET_PAGES
    recent_pages: int = 2
    gqa_combine: str = "sum"
    profile: Path | None = None
    profile_dir: Path | None = None
    dense_fallback: bool = False
    short_dense: bool = True
    verify: int = 0
    top_p: float = 1.0
    policy_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: str, **settings: Any) -> DecodeConfig:
        """`flexicache:verify=8` -> the config; the spec's options override `settings`."""
        name, options = parse_policy_spec(spec)
        return cls(name, **(settings | options))

    def __post_init__(self) -> None:
        check_field_types(self)  # plain fields by their declared types
        from agentcache.decode.policies import DECODE_POLICIES

        policy = DECODE_POLICIES.get(self.policy)  # unknown names fail here, listing them
        try:
            policy(**self.policy_options)  # a bad option value fails here, named by the policy
        except TypeError as e:
            raise ValueError(f"decode policy {self.policy!r}: {e}") from None
        for name in ("profile", "profile_dir"):  # a path as a str or os.PathLike, kept a Path
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                if not isinstance(value, str | os.PathLike):
                    raise ValueError(f"{name} must be a path, got {value!r}")
                object.__setattr__(self, name, Path(value))
        if self.budget_pages < 1:
            raise ValueError(
                f"budget_pages must be >= 1 (got {self.budget_pages}); "
                "use the dense policy for no sparsity"
            )
        if self.recent_pages < 1:
            raise ValueError(f"recent_pages must be >= 1 (got {self.recent_pages})")
        if self.verify < 0:
            raise ValueError(f"verify must be >= 0 (0 = off; got {self.verify})")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = fixed top-K), got {self.top_p}")
        if self.gqa_combine not in GQA_COMBINES:
            raise ValueError(f"gqa_combine must be one of {GQA_COMBINES}, got {self.gqa_combine!r}")


SPEC_KEYS: dict[str, tuple[str, type[Any]]] = {
    "verify": ("verify", int),
    "budget": ("budget_pages", int),
    "recent": ("recent_pages", int),
    "top_p": ("top_p", float),
}


def parse_policy_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`flexicache:verify=8:budget=96` -> ("flexicache", {"verify": 8, "budget_pages": 96}).

    The keys are DecodeConfig settings under short names (SPEC_KEYS), with their types, and the
    policy's own `options` (`streaming:window=16` -> {"policy_options": {"window": 16}})."""
    from agentcache.decode.policies import DECODE_POLICIES

    name, *parts = spec.strip().split(":")
    keys = SPEC_KEYS | {k: (k, kind) for k, kind in DECODE_POLICIES.get(name).options.items()}
    options: dict[str, Any] = {}
    policy_options: dict[str, Any] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or key not in keys:
            known = ", ".join(keys)
            raise ValueError(
                f"decode policy option {part!r} in {spec!r}: use key=value, keys: {known}"
            )
        field_name, kind = keys[key]
        try:
            typed = kind(value)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ValueError(f"decode policy option {part!r} in {spec!r}: not {what}") from None
        (options if key in SPEC_KEYS else policy_options)[field_name] = typed
    if policy_options:
        options["policy_options"] = policy_options
    return name, options
