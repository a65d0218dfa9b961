"""The server benchmarks' parts: structured-output schemas (shared with the server tests), and the
concurrent-agent replay (`benchmarks/server/replay.py`): sessions and pauses, the HTTP client,
the targets it starts, their counters, and the summary and report."""
