from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams, TurnStats

__all__ = ["Engine", "EngineConfig", "Generation", "GenerationParams", "TurnStats"]
