"""The sparse decode suites (tests/decode/) over every family variant serving sparse decode:
with a budget over every page, each page-selecting policy decodes dense decode's tokens and
logits, and a streaming window over the whole context does too; a small budget still finds
the needle page, and sparse decode keeps reuse working."""

from tests.decode.test_sparse import (  # noqa: F401  (collected here, with this `tiny`)
    test_full_budget_equals_dense_decode,
    test_full_budget_logits_match_dense_step_by_step,
    test_small_budget_selects_the_needle_page,
    test_sparse_decode_keeps_reuse_working,
)
from tests.decode.test_streaming import (  # noqa: F401
    test_a_full_window_and_budget_give_dense_greedy_tokens,
)
