"""The decode benchmarks: `agentcache bench-decode` (sparse policies against dense) and
`agentcache bench-dense-decode` (dense decode against `transformers`)."""
