"""Other execution engines agentcache plugs into. Each is imported lazily: the core package
never imports an engine's dependencies."""
