"""Every reuse strategy's contract suite (tests/reuse/test_contract.py) over every family: an
unchanged prompt reproduces full recompute, a changed one runs and reports, a cold turn is
full's prefill, another scope reuses nothing."""

from tests.reuse.test_contract import (  # noqa: F401  (collected here, with this `tiny`)
    test_a_cold_turn_computes_what_full_computes,
    test_another_scope_reuses_nothing,
    test_changed_update_runs_and_reports,
    test_nothing_changed_reproduces_full,
)
