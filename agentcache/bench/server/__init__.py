"""What the server benchmarks share with the server tests: structured-output schemas."""
