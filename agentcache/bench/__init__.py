"""The bench harness: every strategy on the same turns, in one process, ratios to `full`."""
