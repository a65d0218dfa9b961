from __future__ import annotations

import pytest

from agentcache.errors import PromptError
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind


def test_parse_known_kinds() -> None:
    assert SegmentKind.parse("system") is SegmentKind.SYSTEM
    assert SegmentKind.parse("update") is SegmentKind.UPDATE
    assert SegmentKind.parse("fixed") is SegmentKind.FIXED


def test_parse_error_names_bad_kind_and_valid_ones() -> None:
    with pytest.raises(PromptError) as e:
        SegmentKind.parse("memory")
    msg = str(e.value)
    assert "'memory'" in msg
    for kind in SegmentKind:
        assert kind.value in msg


def test_segment_coerces_string_kind() -> None:
    seg = Segment("fixed", "x")  # type: ignore[arg-type]
    assert seg.kind is SegmentKind.FIXED
    with pytest.raises(PromptError, match="'bogus'"):
        Segment("bogus", "x")  # type: ignore[arg-type]


def test_unknown_role_raises_and_lists_roles() -> None:
    with pytest.raises(PromptError) as e:
        Segment(SegmentKind.UPDATE, "hi", role="robot")
    assert "'robot'" in str(e.value)
    assert "assistant" in str(e.value) and "tool" in str(e.value)


def test_non_string_text_raises() -> None:
    with pytest.raises(PromptError, match="must be a string, got int"):
        Segment(SegmentKind.UPDATE, 42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"id": 5}, "segment id must be a string or None, got int 5"),
        ({"id": ["a"]}, "segment id must be a string or None, got list ['a']"),
        ({"scope": {"t": 1}}, "segment scope must be a string or None, got dict"),
        ({"id": "a\ud800"}, "segment id is not valid Unicode"),
    ],
    ids=["int-id", "list-id", "dict-scope", "surrogate-id"],
)
def test_id_and_scope_are_strings(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(PromptError) as e:
        Segment(SegmentKind.FIXED, "text", **kwargs)  # type: ignore[arg-type]
    assert needle in str(e.value)
    if "id" in kwargs:  # a dict's id is read the same way
        with pytest.raises(PromptError, match=r"must be a string or None|not valid Unicode"):
            Segment.from_dict({"kind": "fixed", "text": "text", **kwargs})


def test_text_that_is_not_valid_unicode_raises() -> None:
    with pytest.raises(PromptError) as e:
        Segment(SegmentKind.UPDATE, "ok \ud800 then", role="user")
    assert "not valid Unicode" in str(e.value)
    assert "'\\ud800' at character 3" in str(e.value)


@pytest.mark.parametrize(
    ("segments", "needle"),
    [
        ("just text", "got str"),
        (None, "got NoneType"),
        ([Segment(SegmentKind.SYSTEM, "s"), {"kind": "update", "text": "x"}], "item 1 is a dict"),
    ],
    ids=["string", "none", "dict-item"],
)
def test_prompt_of_things_that_are_not_segments_raises(segments: object, needle: str) -> None:
    with pytest.raises(PromptError) as e:
        SegmentedPrompt(segments)  # type: ignore[arg-type]
    assert needle in str(e.value)
    assert "Segment" in str(e.value)


def test_from_dict_round_trip() -> None:
    seg = Segment.from_dict({"kind": "update", "text": "obs", "id": "o1", "role": "tool"})
    assert seg == Segment(SegmentKind.UPDATE, "obs", "o1", "tool")
    assert Segment.from_dict({"kind": "system", "text": "s"}) == Segment(SegmentKind.SYSTEM, "s")


@pytest.mark.parametrize(
    ("d", "keys"),
    [({"text": "x"}, "['text']"), ({"kind": "fixed"}, "['kind']"), ({}, "[]")],
)
def test_from_dict_missing_keys(d: dict[str, str], keys: str) -> None:
    with pytest.raises(PromptError) as e:
        Segment.from_dict(d)
    assert "'kind' and 'text'" in str(e.value)
    assert keys in str(e.value)


def test_from_dict_bad_kind() -> None:
    with pytest.raises(PromptError, match="'nope'"):
        Segment.from_dict({"kind": "nope", "text": "x"})


@pytest.mark.parametrize(
    "segments",
    [[], [Segment(SegmentKind.SYSTEM, "")], [Segment(SegmentKind.UPDATE, "", role="user")] * 2],
    ids=["no-segments", "one-empty", "all-empty"],
)
def test_empty_prompt_raises(segments: list[Segment]) -> None:
    with pytest.raises(PromptError, match="empty prompt"):
        SegmentedPrompt(segments)


def test_prompt_keeps_order_and_text() -> None:
    p = SegmentedPrompt.from_dicts(
        [
            {"kind": "system", "text": "A"},
            {"kind": "update", "text": ""},
            {"kind": "fixed", "text": "B"},
        ]
    )
    assert [s.kind for s in p.segments] == [
        SegmentKind.SYSTEM,
        SegmentKind.UPDATE,
        SegmentKind.FIXED,
    ]
    assert p.text == "AB"
    # a generator is consumed once and kept
    q = SegmentedPrompt(s for s in p.segments)
    assert q.segments == p.segments
