"""The tiers benchmarks: `agentcache bench-tiers` (spill policies on a tiered store) and the store
trace recorder, whose saved traces `agentcache replay-trace` replays without the model."""
