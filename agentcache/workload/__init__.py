"""Workload files: agent sessions in JSON Lines, read by `agentcache bench` and the prompt
sources of `agentcache profile-heads` (format in docs/benchmarks.md)."""
