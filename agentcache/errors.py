"""Errors raised at agentcache's edges. Each message names the problem and the fix."""


class AgentCacheError(Exception):
    """Base class for every error agentcache raises on purpose."""


class ModelLoadError(AgentCacheError):
    """A model folder, package or checkpoint could not be loaded."""


class PromptError(AgentCacheError):
    """A prompt, segment or template is malformed."""


class ConfigError(AgentCacheError, ValueError):
    """An option or parameter is of the wrong type, out of range, or names nothing known."""


class ContextLengthError(PromptError):
    """A prompt (plus requested new tokens) does not fit the model's context, or `holder`
    (e.g. the engine's KV pool) when that is what limits it."""

    def __init__(
        self, num_tokens: int, max_tokens: int, what: str = "prompt", holder: str | None = None
    ) -> None:
        holds = f"{holder} holds {max_tokens} tokens"
        if holder is None:
            holds = f"the model's context holds {max_tokens} positions"
        super().__init__(f"{what} is {num_tokens} tokens but {holds}")
        self.num_tokens = num_tokens
        self.max_tokens = max_tokens


class OutOfPagesError(AgentCacheError):
    """The page pool cannot hold a request's working set."""


class CacheDirError(AgentCacheError):
    """The cache folder cannot be created or written."""


class OutputDirError(AgentCacheError):
    """A folder a command writes to (results, a disk tier's parent) cannot be created or written."""


class UnknownStrategyError(AgentCacheError):
    """A strategy or policy name is not registered."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")


class ProfileError(AgentCacheError):
    """A head-stability profile is missing, corrupted, or belongs to another model."""


class TraceFileError(AgentCacheError):
    """A saved store trace cannot be read: missing, not a trace, or of another format version."""
