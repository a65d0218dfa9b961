"""The scripts under benchmarks/ are not a package; tests load them by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(path: str) -> ModuleType:
    """benchmarks/<path>.py (e.g. `tiers/turns`) as a module, registered under its file name, as
    its siblings import it (dataclasses look it up)."""
    name = Path(path).name
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{path}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
