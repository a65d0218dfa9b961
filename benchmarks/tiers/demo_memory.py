"""Peak resident memory of `agentcache demo` with the code of two checkouts, interleaved.

    python benchmarks/tiers/demo_memory.py --before /work/main --after . --repeats 2 \
        --out docs/bench/tiers/demo-memory/results.json

Each run is `python -m agentcache demo --turns T --tokens N` in its own process under
`/usr/bin/time -v` (its "Maximum resident set size"), with that checkout's code first on
PYTHONPATH; before and after alternate, so both see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from agentcache.bench.provenance import load_average, provenance


def peak_rss_bytes(checkout: Path, turns: int, tokens: int) -> int:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = ":".join(str(checkout / p) for p in (".", "templates", "adapters"))
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "agentcache", "demo",
           "--turns", str(turns), "--tokens", str(tokens)]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True, check=True)
    kib = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if kib is None:
        raise RuntimeError(f"no peak RSS in /usr/bin/time's output: {done.stderr[-500:]}")
    return int(kib.group(1)) * 1024


def checkout_commit(checkout: Path) -> dict[str, str]:
    """The checkout's path and the commit it has out (the "before" side is named by it)."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return {"path": str(checkout), "commit": done.stdout.strip()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--sides", default="before,after", help="which checkouts run, in order")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    runs: dict[str, list[int]] = {side: [] for side in args.sides.split(",")}
    for _ in range(args.repeats):
        for name in runs:
            checkout = getattr(args, name).resolve()
            runs[name].append(peak_rss_bytes(checkout, args.turns, args.tokens))
            print(name, runs[name][-1] / 2**30, "GiB", flush=True)
    prov = provenance(script="benchmarks/tiers/demo_memory.py")
    results = {
        "provenance": prov,
        "script": prov["command"],
        "measured": f"agentcache demo --turns {args.turns} --tokens {args.tokens}",
        "checkouts": {side: checkout_commit(getattr(args, side)) for side in runs},
        "peak_rss_bytes": runs,
        "median_peak_rss_gib": {k: statistics.median(v) / 2**30 for k, v in runs.items()},
        "load_average": load_average(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
