"""AReaL's staleness rule as one pure function (rlsim.replay.admission)."""
import numpy as np

from rlsim.replay.admission import admitted, consumed


def test_admission_counts_eta_plus_version_plus_one_batches_and_floors_fractions():
    assert [admitted(1, v, 4) for v in range(3)] == [8, 12, 16]
    assert admitted(0.5, 0, 3) == 4 and admitted(0.3, 1, 100) == 230


def test_the_oldest_started_finished_prompts_go_first_ties_in_completion_order():
    # finished in completion order, started at versions 1, 0, 1, 0; nothing is due at update 0 with eta 1
    assert consumed(np.array([1, 0, 1, 0]), np.array([0, 0, 1, 1]), 0, 1, 2).tolist() == [1, 3]
    assert consumed(np.array([1, 0, 1, 0]), np.array([0, 0, 1, 1]), 0, 1, 3).tolist() == [0, 1, 3]


def test_it_waits_rather_than_leave_more_due_prompts_than_one_batch():
    # P 3, eta 2, update 1: three version-1 prompts finished while five version-0 prompts still run. Taking the
    # finished ones would leave five prompts due at update 2 (deadline 0 + 2) for a batch of three.
    open_ = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    assert consumed(np.array([1, 1, 1]), open_, 1, 2, 3) is None
    # once two version-0 prompts have finished, taking them and one newer leaves three due at update 2: it fits
    assert consumed(np.array([1, 1, 1, 0, 0]), open_, 1, 2, 3).tolist() == [0, 3, 4]


def test_a_due_prompt_still_running_makes_the_update_wait():
    assert consumed(np.array([1, 1]), np.array([0, 1, 1]), 1, 1, 2) is None
    assert consumed(np.array([1, 1, 0]), np.array([0, 1, 1]), 1, 1, 2).tolist() == [0, 2]
