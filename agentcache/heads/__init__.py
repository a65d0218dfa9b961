"""Head profiling, `agentcache profile-heads`: each prompt prefilled by the engine, then traced by
`decode.profiler`; the long prompts it (and the decode bench) cuts from texts."""
