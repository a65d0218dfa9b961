"""Progress of long commands: a bar on a terminal, plain lines in a log."""

from __future__ import annotations

import io

from rich.console import Console

from agentcache.progress import progress_bar


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=100), out


def test_a_log_gets_a_plain_line_per_advance_at_most_every_so_often_and_the_last() -> None:
    console, out = _console(terminal=False)
    with progress_bar(console) as progress:
        progress.every_s = 3600.0  # only the first and the last line come out
        task = progress.add_task("bench", total=5)
        for i in range(5):
            progress.update(task, advance=1, description=f"session-{i} [rpdc]")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("session-0 [rpdc] 1/5 (0m 00s)")  # markup left as written
    assert "session-4 [rpdc] 5/5" in lines[1]
    assert lines[0].startswith("[") and lines[0][9] == "]"  # [HH:MM:SS]


def test_every_advance_is_a_line_when_the_interval_is_zero() -> None:
    console, out = _console(terminal=False)
    with progress_bar(console) as progress:
        progress.every_s = 0.0
        task = progress.add_task("profile-heads", total=None)
        progress.advance(task)
        progress.advance(task)
    assert [x.split("] ", 1)[1] for x in out.getvalue().splitlines()] == [
        "profile-heads 1 (0m 00s)",
        "profile-heads 2 (0m 00s)",
    ]


def test_a_terminal_gets_the_bar_and_no_plain_lines() -> None:
    console, out = _console(terminal=True)
    with progress_bar(console) as progress:
        task = progress.add_task("bench", total=2)
        progress.update(task, advance=2)
    text = out.getvalue()
    assert "2/2" in text and "(0m 00s)" not in text
