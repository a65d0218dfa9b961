"""Position drift of a reused segment (CacheSlide's PMKD measurement): CKSim between a fixed
segment's cached keys and its recomputed keys as the update segment in front of it grows.

    cached     : [ system ][ fixed F ]                      F's keys computed here (shift 0)
    recomputed : [ system ][ update: `shift` tokens ][ fixed F ]

CKSim(layer) = mean over F's tokens and KV heads of cos(K_recomputed, K_cached); reported per
layer and averaged over layers. Three encodings:
- rope         : the base model, cached keys used as stored (no re-rotation);
- rope-rerot   : the base model, cached keys re-rotated to their new positions (exact for the
                 RoPE part: what is left is the context's effect);
- cope         : the base model with the trained CoPE adapter (RoPE replaced): keys carry no
                 position, so there is nothing to re-rotate.
It also records the CoPE encoding of F's first token at each shift (reuse/ccpe.py).

Texts: held-out documents of the adapter's training corpus (essays for F, chats for updates).

    HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python benchmarks/cope/drift.py --threads 1 \
        --out docs/bench/cope/drift
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress
from torch import Tensor

from agentcache.bench.results import write_run
from agentcache.cope.checkpoint import load_cope_adapter
from agentcache.cope.data import HELD_OUT_EVERY, documents
from agentcache.model.cope import CoPEForward
from agentcache.model.llama import LlamaForward
from agentcache.model.loading import LoadedModel, load_model
from agentcache.reuse.ccpe import chunk_encodings

SYSTEM = "You are a careful assistant. Read the notes and the conversation, then answer.\n"
SHIFTS = (0, 50, 100, 250, 500, 1000, 2000)


def keys_of(forward: LlamaForward, ids: list[int]) -> Tensor:
    """Every layer's keys of `ids` at positions 0.. (L, T, Hkv, Dh)."""
    with torch.no_grad():
        return forward.forward(torch.tensor(ids, dtype=torch.int64)).keys


def cksim_per_layer(fresh: Tensor, cached: Tensor) -> list[float]:
    """(L, T, Hkv, Dh) x2 -> per layer mean cosine over tokens and heads."""
    cos = torch.nn.functional.cosine_similarity(fresh, cached, dim=-1)  # (L, T, Hkv)
    return [float(x) for x in cos.mean(dim=(1, 2))]


def measure(
    base: LoadedModel, cope: LoadedModel, fixed: list[int], update: list[int], shifts: list[int]
) -> dict[str, dict[int, list[float]]]:
    sys_ids = base.tokenizer.encode(SYSTEM)
    n_sys, n_fix = len(sys_ids), len(fixed)
    span = slice(n_sys, n_sys + n_fix)
    out: dict[str, dict[int, list[float]]] = {"rope": {}, "rope-rerot": {}, "cope": {}}
    cached_rope = keys_of(base.forward, sys_ids + fixed)[:, span]
    cached_cope = keys_of(cope.forward, sys_ids + fixed)[:, span]
    old = torch.arange(n_sys, n_sys + n_fix)
    for shift in shifts:
        ids = sys_ids + update[:shift] + fixed
        new_span = slice(n_sys + shift, n_sys + shift + n_fix)
        fresh_rope = keys_of(base.forward, ids)[:, new_span]
        rerot = base.forward.rope.rerotate(cached_rope, old, old + shift)
        out["rope"][shift] = cksim_per_layer(fresh_rope, cached_rope)
        out["rope-rerot"][shift] = cksim_per_layer(fresh_rope, rerot)
        out["cope"][shift] = cksim_per_layer(keys_of(cope.forward, ids)[:, new_span], cached_cope)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shifts", default=",".join(map(str, SHIFTS)))
    ap.add_argument("--samples", type=int, default=3, help="(fixed, update) text pairs")
    ap.add_argument("--fixed-tokens", type=int, default=128, help="tokens in the fixed segment")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adapter", type=Path, default=None, help="adapter file (default: cache)")
    ap.add_argument("--out", type=Path, default=Path("docs/bench/cope/drift"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    shifts = [int(s) for s in args.shifts.split(",")]
    base = load_model(None)
    cope = load_cope_adapter(base, path=args.adapter)
    assert isinstance(cope.forward, CoPEForward)
    docs = [d for i, d in enumerate(documents()) if i % HELD_OUT_EVERY == 0]
    essays = [d for d in docs if d.source == "essay"]
    chats = " ".join(d.text for d in docs if d.source == "chat")
    chat_ids = base.tokenizer.encode(chats)
    runs = []
    t0 = time.perf_counter()
    with Progress(console=console) as progress:
        task = progress.add_task("cope drift", total=args.samples)
        for i in range(args.samples):
            fixed = base.tokenizer.encode(essays[i].text)[200 : 200 + args.fixed_tokens]
            update = chat_ids[i * max(shifts) : (i + 1) * max(shifts)]
            runs.append(measure(base, cope, fixed, update, shifts))
            progress.advance(task)
    sys_ids = base.tokenizer.encode(SYSTEM)
    enc = {}
    for shift in shifts:
        ids = sys_ids + chat_ids[:shift] + base.tokenizer.encode(essays[0].text)[200:201]
        enc[shift] = chunk_encodings(cope.forward, ids, [len(ids) - 1])[0]
    cksim = aggregate(runs)
    result = {
        "command": "benchmarks/cope/drift.py " + " ".join(sys.argv[1:]),
        "model_id": base.model_id,
        "cope_model_id": cope.model_id,
        "max_position": cope.forward.max_position,
        "samples": args.samples,
        "fixed_tokens": args.fixed_tokens,
        "shifts": shifts,
        "cksim": cksim,
        "cope_encoding": enc,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write(args.out, result)
    console.print((args.out / "drift.md").read_text(encoding="utf-8"))


def aggregate(runs: list[dict[str, dict[int, list[float]]]]) -> dict[str, dict[int, Any]]:
    """Mean over samples, per layer, and the mean over layers."""
    out: dict[str, dict[int, Any]] = {}
    for variant in runs[0]:
        out[variant] = {}
        for shift in runs[0][variant]:
            layers = (r[variant][shift] for r in runs)
            per_layer = [statistics.fmean(xs) for xs in zip(*layers, strict=True)]
            out[variant][shift] = {"mean": statistics.fmean(per_layer), "per_layer": per_layer}
    return out


def write(out: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    write_run(out, result)
    cks, shifts = result["cksim"], result["shifts"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for variant in cks:
        left.plot(shifts, [cks[variant][s]["mean"] for s in shifts], marker="o", label=variant)
        right.plot(cks[variant][shifts[-1]]["per_layer"], marker=".", label=variant)
    left.set(xlabel="update tokens in front of the fixed segment (shift)", ylabel="CKSim")
    left.set_title("layer-mean CKSim, cached vs recomputed keys")
    left.set_xscale("symlog", linthresh=50)
    right.set(xlabel="layer", ylabel="CKSim", title=f"per layer at shift {shifts[-1]}")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "drift.png", dpi=110)
    rows = ["| shift | rope (no re-rotation) | rope re-rotated | cope | CoPE encoding of F |"]
    rows.append("|---:|---:|---:|---:|---:|")
    for s in shifts:
        vals = " | ".join(f"{cks[v][s]['mean']:.4f}" for v in ("rope", "rope-rerot", "cope"))
        rows.append(f"| {s} | {vals} | {result['cope_encoding'][s]} |")
    (out / "drift.md").write_text("\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
