"""`agentcache profile-heads`' run: each prompt prefilled by the engine, then traced by
`decode.profiler.trace_heads`; the profile's PNG heat map."""

from __future__ import annotations

from collections.abc import Callable

from agentcache.decode.profile import DEFAULT_WINDOW, HeadProfile
from agentcache.decode.profiler import PAGE, ProfileSettings, head_profile, trace_heads
from agentcache.model.loading import LoadedModel
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.runtime.engine import Engine, EngineConfig


def profile_heads(
    model: LoadedModel,
    prompts: list[TokenizedPrompt],
    settings: ProfileSettings,
    on_step: Callable[[], None] | None = None,
) -> HeadProfile:
    """Profile `model` on `prompts` (each must have more than budget + 2 pages)."""
    for prompt in prompts:  # every prompt checked before the first prefill
        settings.check_prompt(prompt.num_tokens)
    kv_pages = 2 + max(p.num_tokens for p in prompts) // PAGE
    engine = Engine(model, EngineConfig(strategy="full", kv_pages=kv_pages))
    traces = []
    for prompt in prompts:
        seq, pre = engine.prefill(prompt)
        try:
            keys, values = seq.gather_all(slice(0, seq.num_tokens))
        finally:
            seq.free()
        token, position = int(pre.logits.argmax()), int(pre.positions.max()) + 1
        traces.append(trace_heads(model.forward, keys, values, token, position, settings, on_step))
    return head_profile(model, traces, settings, [p.num_tokens for p in prompts])


def plot_profile(profile: HeadProfile, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = profile.stability_tensor().numpy()
    fig, ax = plt.subplots(figsize=(2.5 + 0.6 * profile.num_kv_heads, 1.5 + 0.22 * len(s)))
    im = ax.imshow(s, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    for layer, head in profile.unstable:
        ax.text(head, layer, "x", ha="center", va="center", color="red", fontsize=8)
    ax.set_xlabel("KV head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(profile.num_kv_heads))
    window = profile.settings.get("window", DEFAULT_WINDOW)
    ax.set_title(f"Head stability (mean RCO, {window}-step windows)\nx = unstable", fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
