"""Every reuse strategy's contract suite (tests/reuse/test_contract.py) over every family
variant that serves the strategy (conftest.py skips a pair the family declares it cannot run;
test_refusals.py tests that refusal): an unchanged prompt reproduces full recompute, a changed
one runs and reports, a cold turn is full's prefill, another model's or scope's segments are
never served."""

from tests.reuse.test_contract import (  # noqa: F401  (collected here, with this `tiny`)
    test_a_cold_turn_computes_what_full_computes,
    test_another_scope_reuses_nothing,
    test_changed_update_runs_and_reports,
    test_never_serves_another_models_segments,
    test_nothing_changed_reproduces_full,
    test_overhead_is_the_prefill_time_not_spent_computing,
)
