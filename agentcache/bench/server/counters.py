"""A server's counters from its /metrics page (Prometheus text), read before and after a phase.

Each reported quantity names the samples that hold it on each kind of server; a server with
none of them reports None for it (the vLLM backend has no batched scheduler, so no swapped
bytes, plain vLLM no segment store, a flat segment store no tiers), never 0. The vLLM
backend's preemptions are vLLM's, counted by the connector as each turn finishes. Where
several samples match (vLLM labels its counters by model), they are summed.

| quantity         | agentcache serve                         | vllm serve                        |
|------------------|------------------------------------------|-----------------------------------|
| preemptions      | `agentcache_batch{kind="preempted"}`     | `vllm:num_preemptions_total`      |
| swapped_bytes    | `agentcache_batch{kind="swapped_bytes"}` |                                   |
| spilled_bytes    | `agentcache_tiers{kind=<quantity>}`      |                                   |
| prefetched_pages | `agentcache_tiers{kind=<quantity>}`      |                                   |
| promoted_pages   | `agentcache_tiers{kind=<quantity>}`      |                                   |
| prefix_hits      |                                          | `vllm:prefix_cache_hits_total`    |
| prefix_queries   |                                          | `vllm:prefix_cache_queries_total` |

Pages are the tiered store's, of 16 tokens (a segment's last page may hold fewer).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", re.M)

Match = Callable[[str, str], bool]  # (metric name, labels text) -> whether it counts


def _exact(name: str, labels: str = "") -> Match:
    return lambda n, lab: n == name and (not labels or labels in lab)


QUANTITIES: dict[str, tuple[Match, ...]] = {
    "preemptions": (_exact("agentcache_batch", 'kind="preempted"'),
                    _exact("vllm:num_preemptions_total")),
    "swapped_bytes": (_exact("agentcache_batch", 'kind="swapped_bytes"'),),
    "spilled_bytes": (_exact("agentcache_tiers", 'kind="spilled_bytes"'),),
    "prefetched_pages": (_exact("agentcache_tiers", 'kind="prefetched_pages"'),),
    "promoted_pages": (_exact("agentcache_tiers", 'kind="promoted_pages"'),),
    "prefix_hits": (_exact("vllm:prefix_cache_hits_total"),),
    "prefix_queries": (_exact("vllm:prefix_cache_queries_total"),),
}  # fmt: skip


def samples(text: str) -> list[tuple[str, str, float]]:
    """The (name, labels, value) samples of a Prometheus text page (comments skipped)."""
    out = []
    for name, labels, value in SAMPLE.findall(text):
        try:
            out.append((name, labels, float(value)))
        except ValueError:
            continue
    return out


def quantities(text: str) -> dict[str, float | None]:
    """Each of QUANTITIES on this page: the sum of its matching samples, None when none match
    (`_created` timestamps never count)."""
    found = [s for s in samples(text) if not s[0].endswith("_created")]
    out: dict[str, float | None] = {}
    for key, matches in QUANTITIES.items():
        hits = [v for n, lab, v in found if any(m(n, lab) for m in matches)]
        out[key] = sum(hits) if hits else None
    return out


def difference(before: dict[str, float | None],
               after: dict[str, float | None]) -> dict[str, float | None]:  # fmt: skip
    """after - before for each quantity that both pages have; None otherwise."""
    return {k: None if before.get(k) is None or after.get(k) is None
            else after[k] - before[k]  # type: ignore[operator]
            for k in after}  # fmt: skip


def scrape(url: str) -> dict[str, float | None]:
    """The quantities of the server at `url` now (all None when it has no /metrics)."""
    r = httpx.get(f"{url}/metrics", timeout=60)
    return quantities(r.text if r.status_code == 200 else "")
