"""Why greedy exact match misses: the reference's top-1 / top-2 margin where a strategy parts.

For every warm turn where a strategy's greedy continuation leaves `full`'s (from a bench run's
results.json), recompute `full` on that turn and report the log-probability gap between its
top-1 and top-2 tokens at the first step that differs, next to the gaps at every step of every
turn (how close a typical step is). A gap of a few hundredths of a nat is a near-tie that any
approximate KV (KL ~1e-3) can flip; the continuation after a flip is a different text.

    python benchmarks/reuse/greedy_margins.py docs/bench/wide-reflexion/results.json \
        --strategies pic,rpdc
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from agentcache.model.loading import load_model
from agentcache.runtime import Engine
from agentcache.workload.files import load_workload


def margins(engine: Engine, prompt_text: object, steps: int) -> list[float]:
    """log p(top1) - log p(top2) of `full`'s greedy decoding, per step."""
    prompt = engine.tokenize(prompt_text)  # type: ignore[arg-type]
    seq, pre = engine.prefill(prompt, "full")
    try:
        logits, position, out = pre.logits, int(pre.positions.max()) + 1, []
        for _ in range(steps):
            top = torch.log_softmax(logits.float(), dim=-1).topk(2).values
            out.append(float(top[0] - top[1]))
            token = int(logits.argmax())
            logits = engine.step(seq, token, position)
            position += 1
        return out
    finally:
        seq.free()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--strategies", default="pic,rpdc")
    ap.add_argument("--out", type=Path, help="write the table (markdown) here too")
    args = ap.parse_args()
    results = json.loads(args.results.read_text())
    workload = Path(results["command"].split()[2])
    sessions = {s.name: s for s in load_workload(workload).sessions}
    wanted = args.strategies.split(",")
    records = [t for t in results["turns"] if t["turn"] > 0]
    engine = Engine(load_model(None))
    cache: dict[tuple[str, int], list[float]] = {}
    all_gaps: list[float] = []
    for t in records:
        key = (t["session"], t["turn"])
        if key not in cache and t["strategy"] == "full":
            turn = sessions[t["session"]].turns[t["turn"]]
            cache[key] = margins(engine, turn.prompt, int(t["greedy_agree_prefix"]))
            all_gaps += cache[key]
    lines = ["| strategy | session | turn | parts at step | full's top-1 / top-2 gap (nats) |"]
    lines.append("|---|---|---|---|---|")
    parted: list[float] = []
    for t in records:
        if t["strategy"] in wanted and t["greedy_exact_match"] < 1:
            step = int(t["greedy_agree_prefix"])
            gap = cache[(t["session"], t["turn"])][step]
            parted.append(gap)
            lines.append(f"| {t['strategy']} | {t['session']} | {t['turn']} | {step} | {gap:.3f} |")
    q = statistics.quantiles(all_gaps, n=20)
    lines += [
        "",
        f"{len(all_gaps)} steps of `full` on {len(cache)} warm turns: gap median "
        f"{statistics.median(all_gaps):.2f}, 5th percentile {q[0]:.3f}; steps where a strategy "
        f"parted: median {statistics.median(parted):.3f}, max {max(parted):.3f}.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
