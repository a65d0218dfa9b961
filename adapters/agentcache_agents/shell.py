"""An offline workspace for SWE-style agents: an in-memory file tree and a small shell.

Commands: ls [DIR], cd DIR, pwd, cat FILE, grep PATTERN [FILE...], sed -i 's/OLD/NEW/' FILE,
echo TEXT > FILE, pytest (runs the task's check), submit. Anything else answers like a shell
does (`bash: x: command not found`).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Mapping

Check = Callable[[Mapping[str, str]], tuple[bool, str]]  # files -> (passed, test output)

TOOL_DOCS = (
    ("ls [DIR]", "list a directory"),
    ("cd DIR", "change the current directory"),
    ("cat FILE", "print a file with line numbers and open it"),
    ("grep PATTERN [FILE...]", "print the lines that contain PATTERN"),
    ("sed -i 's/OLD/NEW/' FILE", "replace the first OLD in each line of FILE by NEW"),
    ("echo TEXT > FILE", "write TEXT to FILE"),
    ("pytest", "run the tests"),
    ("submit", "finish the task"),
)


class Workspace:
    def __init__(self, files: Mapping[str, str], check: Check, root: str = "/repo") -> None:
        self.root = root
        self.files = {posixpath.join(root, p): text for p, text in files.items()}
        self.check = check
        self.cwd = root
        self.open_file: str | None = None
        self.submitted = False

    def relative(self) -> dict[str, str]:
        return {posixpath.relpath(p, self.root): t for p, t in self.files.items()}

    def _path(self, name: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, name))

    def _dirs(self) -> set[str]:
        dirs = {self.root}
        for p in self.files:
            while (p := posixpath.dirname(p)) not in ("/", ""):
                dirs.add(p)
        return dirs

    def run(self, command: str) -> str:
        """Run one command; returns its output (errors included, as a shell prints them)."""
        try:
            argv = shlex.split(command)
        except ValueError as e:
            return f"bash: syntax error: {e}"
        if not argv:
            return ""
        handler = getattr(self, f"_cmd_{argv[0]}", None)
        if handler is None:
            return f"bash: {argv[0]}: command not found"
        out: str = handler(argv[1:])
        return out

    def _cmd_ls(self, args: list[str]) -> str:
        args = [a for a in args if not a.startswith("-")]  # options change only the format
        d = self._path(args[0]) if args else self.cwd
        if d not in self._dirs():
            return f"ls: cannot access '{args[0]}': No such file or directory"
        names = {posixpath.relpath(p, d).split("/")[0] for p in self.files if p.startswith(d + "/")}
        return "\n".join(sorted(names))

    def _cmd_cd(self, args: list[str]) -> str:
        d = self._path(args[0] if args else self.root)
        if d not in self._dirs():
            return f"bash: cd: {args[0]}: No such file or directory"
        self.cwd = d
        return ""

    def _cmd_pwd(self, args: list[str]) -> str:
        return self.cwd

    def _cmd_cat(self, args: list[str]) -> str:
        if not args or self._path(args[0]) not in self.files:
            return f"cat: {args[0] if args else ''}: No such file or directory"
        self.open_file = self._path(args[0])
        lines = self.files[self.open_file].splitlines()
        return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(lines, 1))

    def _cmd_grep(self, args: list[str]) -> str:
        if not args:
            return "usage: grep PATTERN [FILE...]"
        paths = [self._path(a) for a in args[1:]] or sorted(self.files)
        hits = []
        for p in paths:
            if p not in self.files:
                hits.append(f"grep: {p}: No such file or directory")
                continue
            for i, line in enumerate(self.files[p].splitlines(), 1):
                if args[0] in line:
                    hits.append(f"{posixpath.relpath(p, self.cwd)}:{i}:{line}")
        return "\n".join(hits)

    def _cmd_sed(self, args: list[str]) -> str:
        if len(args) != 3 or args[0] != "-i" or not args[1].startswith("s"):
            return "sed: only sed -i 's/OLD/NEW/' FILE is supported"
        parts = args[1][1:].split(args[1][1:2])
        if len(parts) < 3 or self._path(args[2]) not in self.files:
            return f"sed: cannot apply {args[1]!r} to {args[2]!r}"
        old, new, path = parts[1], parts[2], self._path(args[2])
        lines = self.files[path].splitlines(keepends=True)
        self.files[path] = "".join(line.replace(old, new, 1) for line in lines)
        return ""

    def _cmd_echo(self, args: list[str]) -> str:
        if len(args) >= 2 and args[-2] == ">":
            self.files[self._path(args[-1])] = " ".join(args[:-2]) + "\n"
            return ""
        return " ".join(args)

    def _cmd_pytest(self, args: list[str]) -> str:
        return self.check(self.relative())[1]

    def _cmd_submit(self, args: list[str]) -> str:
        self.submitted = True
        return "Submitted."
