"""Property-based fuzzing of the trace reader and the `rlsim` CLI (hypothesis; properties in
tests/fuzz_props.py, shared with the longer campaign `python bench/fuzz_campaign.py --examples N`).

Cases per CI run (derandomized, so every run draws the same cases):
- mutated grpo_p32 trace (values, rows, bytes, types, columns, metadata) -> reader + `rlsim replay|run`: 25
- mutated ppo_b256 trace, same: 60
- metadata-only mutations of ppo_b256 -> reader + `rlsim replay|run`: 30
- `rlsim run` configs with up to 3 options at an edge (P, G, gen batch, updates, target, engine limits,
  lr rule, rho, seed), at most 65536 responses per update: 60
- huge batches (P up to 10**18), each in a subprocess with 20 s and 6 GB limits: 2
- `rlsim run|sweep|plan` with an execution mode, its settings (in range, out of range, wrong type, given to a mode
  that does not read them) and devices, 20 s per case: 24
- `rlsim.predict(trace, mode=..., ...)` with the same settings as Python values: 12
Total 213 cases per CI run.
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzz_props as fp

CI = dict(deadline=None, derandomize=True, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


@settings(max_examples=25, **CI)
@given(mutation=fp.MUTATIONS, command=st.sampled_from(fp.COMMANDS))
def test_mutated_grpo_trace(mutation, command):
    fp.prop_mutated_trace("grpo_p32", mutation, command)


@settings(max_examples=60, **CI)
@given(mutation=fp.MUTATIONS, command=st.sampled_from(fp.COMMANDS))
def test_mutated_ppo_trace(mutation, command):
    fp.prop_mutated_trace("ppo_b256", mutation, command)


@settings(max_examples=30, **CI)
@given(mutation=fp.META_MUTATIONS, command=st.sampled_from(fp.COMMANDS))
def test_mutated_metadata(mutation, command):
    fp.prop_mutated_trace("ppo_b256", mutation, command)


@settings(max_examples=60, **CI)
@given(cfg=fp.BOUNDED_CONFIGS)
def test_cli_configs_at_the_edges(cfg):
    fp.prop_cli_config(cfg)


@settings(max_examples=2, **CI)
@given(cfg=fp.HUGE)
def test_huge_batches_refuse_or_finish(cfg):
    """Known gap until huge batches are cheap to simulate: such a run may neither refuse nor finish within
    the limits; that is reported as xfail, not hidden. A traceback or a multi-line error still fails."""
    out = fp.prop_cli_huge(cfg)
    if out == "timeout":
        pytest.xfail(f"rlsim run --batch {cfg['batch']} --group {cfg['group']} neither refused nor finished in 20 s")


@settings(max_examples=24, **CI)
@given(cfg=fp.MODE_CONFIGS)
def test_execution_modes_and_their_settings(cfg):
    fp.prop_cli_mode(cfg)


@settings(max_examples=12, **CI)
@given(call=fp.API_CALLS)
def test_predict_with_a_mode_returns_or_raises_rlsimerror(call):
    fp.prop_api_mode(call)
