"""The reuse bench (`agentcache bench`): every strategy on the same turns, in one process, ratios
to `full`; the workload generators; the plan predictor's fit and reports (planner/)."""
