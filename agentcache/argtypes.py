"""Checks of the `agentcache` subcommands' arguments: numbers in range when the command line is
parsed, output folders and files before any model loads (so a typo fails in a second, not
after an hour of benchmarking)."""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from agentcache.errors import OutputDirError
from agentcache.units import parse_bytes


def _number(
    text: str, convert: Callable[[str], float], ok: Callable[[float], bool], what: str
) -> float:
    try:
        value = convert(text)
    except ValueError:
        value = math.nan  # fails every range check
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, lambda v: v >= 1, "an integer >= 1"))


def non_negative_int(text: str) -> int:
    return int(_number(text, int, lambda v: v >= 0, "an integer >= 0"))


MAX_THREADS = 1024


def thread_count(text: str) -> int:
    """torch threads: 0 (every core) up to MAX_THREADS; past that torch's own setter overflows
    or a pool of that many threads is made."""
    what = f"an integer from 0 to {MAX_THREADS} (0: all cores)"
    return int(_number(text, int, lambda v: 0 <= v <= MAX_THREADS, what))


def port_number(text: str) -> int:
    what = "a port number from 0 to 65535 (0: any free port)"
    return int(_number(text, int, lambda v: 0 <= v <= 65535, what))


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0.0 < v < math.inf, "a finite number > 0")


def non_negative_float(text: str) -> float:
    return _number(text, float, lambda v: 0.0 <= v < math.inf, "a finite number >= 0")


def path_text(text: str) -> str:
    """A file or folder named on the command line, as written (`--model` also takes the name
    "default"): an empty name (an unset shell variable, `--disk-dir "$DIR"`) would otherwise
    be the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file or folder, got {text!r}")
    return text


def path_arg(text: str) -> Path:
    """`path_text`, as a Path."""
    return Path(path_text(text))


def byte_size(text: str) -> int:
    """A size >= 1 byte: "2GiB", "512MiB", "1.5GB", "1048576" (`units.parse_bytes`)."""
    try:
        value = parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def fraction(text: str) -> float:
    return _number(text, float, lambda v: 0.0 <= v <= 1.0, "a number from 0 to 1")


# folders `output_folder`/`output_file` created in this process: a command that fails removes
# those it left empty (`end_outputs`)
_created: list[Path] = []


def end_outputs(failed: bool) -> None:
    """At the end of a command: when it failed, remove the folders it created for output
    that are still empty (a partial result stays); then forget them."""
    deepest_first = sorted(_created, key=lambda f: len(f.parts), reverse=True)
    for folder in deepest_first if failed else ():
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty
    _created.clear()


def _folder_problem(folder: Path) -> str | None:
    """Create `folder` (and its parents); what is wrong when a file cannot be written in it."""
    if folder.exists() and not folder.is_dir():
        return "is a file, not a folder"
    try:
        folder = folder.absolute()
        _created.extend(f for f in (folder, *folder.parents) if not f.exists())
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"cannot be created or written ({e.strerror or e})"
    return None


def output_folder(folder: Path, option: str) -> Path:
    """`folder`, created with its parents; OutputDirError when it cannot be written."""
    if problem := _folder_problem(folder):
        raise OutputDirError(f"{option} {folder} {problem}; choose a writable folder")
    return folder


def output_file(path: Path, option: str) -> Path:
    """`path`, its folder created; OutputDirError when the file could not be written there."""
    if path.is_dir():
        raise OutputDirError(f"{option} {path} is a folder; give a file path")
    if problem := _folder_problem(path.parent):
        raise OutputDirError(
            f"{option} {path}: folder {path.parent} {problem}; choose a writable path"
        )
    return path
