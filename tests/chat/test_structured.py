"""The constraint seam without a server: the mask a grammar gives, `sampling.constrain` against
plain logits, and logprob recording that changes no token."""

from __future__ import annotations

import pytest
import torch

from agentcache.chat.logprobs import LogprobRecorder
from agentcache.chat.structured import Grammars, OutputFormat, SchemaError
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.runtime.sampling import constrain

pytest.importorskip("llguidance")

VOCAB = 260


def grammars() -> Grammars:
    return Grammars(ByteTokenizer(), VOCAB)


def test_no_constraint_is_the_logits_themselves() -> None:
    logits = torch.randn(VOCAB)
    assert constrain(logits, None, []) is logits


def test_the_mask_allows_exactly_what_the_grammar_continues_with() -> None:
    c = grammars().constraint(OutputFormat("json_schema", {"enum": ["ab", "ac"]}, "f"))
    logits = torch.zeros(VOCAB)
    first = torch.isfinite(constrain(logits, c, [])).nonzero().flatten().tolist()
    assert first == [ord('"')]
    after = torch.isfinite(constrain(logits, c, list(b'"a'))).nonzero().flatten().tolist()
    assert after == [ord("b"), ord("c")]
    done = torch.isfinite(constrain(logits, c, list(b'"ab"'))).nonzero().flatten().tolist()
    assert done == [ByteTokenizer.EOS] and c.violations == 0
    assert torch.equal(logits, torch.zeros(VOCAB))  # the input is not changed


def test_a_token_the_mask_never_saw_is_counted_and_ends_the_reply() -> None:
    c = grammars().constraint(OutputFormat("json_object", None, "f"))
    mask = constrain(torch.zeros(VOCAB), c, list(b"x"))
    assert c.violations == 1
    assert torch.isfinite(mask).nonzero().flatten().tolist() == [ByteTokenizer.EOS]


def test_a_construct_llguidance_cannot_enforce_is_named() -> None:
    with pytest.raises(SchemaError, match="not") as e:
        grammars().constraint(OutputFormat("json_schema", {"not": {}}, "response_format"))
    assert e.value.param == "response_format"


def test_recording_logprobs_changes_no_logit_and_reads_the_chosen_tokens() -> None:
    steps = [torch.randn(VOCAB) for _ in range(3)]
    rec = LogprobRecorder(top=2)
    ids: list[int] = []
    for logits in steps:
        out = constrain(logits, rec, ids)
        assert out is logits
        ids.append(int(torch.argmax(out)))
    got = rec.finish(ids)
    for step, logits, token in zip(got, steps, ids, strict=True):
        want = torch.log_softmax(logits.double(), -1)
        assert step.token_id == token and step.logprob == pytest.approx(float(want[token]))
        assert [i for i, _ in step.top] == torch.topk(want, 2).indices.tolist()
