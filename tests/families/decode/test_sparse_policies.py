"""The sparse decode suite (tests/decode/test_sparse.py) over every family serving it: with a
budget over every page, each policy decodes dense decode's tokens and logits."""

from tests.decode.test_sparse import (  # noqa: F401  (collected here, with this `tiny`)
    test_full_budget_equals_dense_decode,
    test_full_budget_logits_match_dense_step_by_step,
)
