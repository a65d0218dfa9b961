"""bench.reuse.generate: seeded sessions that keep history items verbatim, vary with the seed, and
reject bad settings."""

from __future__ import annotations

import copy
import itertools

import pytest

from agentcache.bench.reuse.generate import TextPool, check_generated, generate_session

POOL = TextPool(
    passages=tuple(f"passage {i} " + "word " * 40 for i in range(7)),
    requests=("Open the report.", "Compare the two files."),
    actions=("cat(file='a.txt')", "diff(a='a.txt', b='b.txt')", "ls()"),
    tools=("- cat(file: string): print a file", "- ls(): list the folder"),
)


def words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("case", ["swing", "shift"])
def test_a_session_is_its_seeds_and_keeps_its_history_verbatim(case: str) -> None:
    one = generate_session(7, "g", "tune", POOL, case)
    assert one == generate_session(7, "g", "tune", POOL, case)
    assert one != generate_session(8, "g", "tune", POOL, case)
    assert len(check_generated(one, words)) == 6
    ids = [[s["id"] for s in t["segments"]] for t in one["turns"]]
    assert all(i[0] == "sys" and i[-1] == "reply" for i in ids)
    # each turn adds the structure's new items; earlier items stay (fixed) in place
    grown = [sum(x.startswith("h-") for x in i) for i in ids]
    assert grown == [
        one["structure"]["prefilled"] + sum(one["structure"]["new_items"][: t + 1])
        for t in range(6)
    ]


def test_a_swing_block_changes_by_hundreds_of_words_and_a_shift_block_by_a_line() -> None:
    for case, low, high in (("swing", 175, 400), ("shift", 1, 20)):
        sess = generate_session(3, "g", "tune", POOL, case)
        first = [next(s for s in t["segments"] if s["id"] == "upd-0") for t in sess["turns"]]
        deltas = [abs(words(b["text"]) - words(a["text"])) for a, b in itertools.pairwise(first)]
        assert all(low <= d <= high for d in deltas), (case, deltas)


def test_the_check_fails_a_changed_history_item() -> None:
    sess = generate_session(5, "g", "tune", POOL, "shift")
    broken = copy.deepcopy(sess)
    seg = next(s for s in broken["turns"][2]["segments"] if s["id"] == "h-0")
    seg["text"] += " (edited)"
    with pytest.raises(ValueError, match="g turn 2: h-0 changed"):
        check_generated(broken, words)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"case": "wobble"}, "unknown case 'wobble'"), ({"turns": 0}, "turns must be at least 1")],
)
def test_bad_settings_are_errors(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"case": "swing", "turns": 6} | kwargs
    with pytest.raises(ValueError, match=needle):
        generate_session(1, "g", "tune", POOL, **args)  # type: ignore[arg-type]


def test_an_empty_text_list_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"TextPool\.tools must not be empty"):
        TextPool(POOL.passages, POOL.requests, POOL.actions, ())
