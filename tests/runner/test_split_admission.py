"""The staleness rule is one rule: the runner's controller (runner/split.py `StalenessBook`) and the simulator's
gate and consumption (rlsim.modes.requests) admit and consume the same prompts for the same finish order."""
import numpy as np
import pytest
import simpy

from rlsim.modes.requests import AdmissionGate, FinishedGroups
from rlsim.runner.split import StalenessBook

NOT_STARTED = np.iinfo(np.int64).max


def _runner(P, eta, U, finish_order):
    """Admitted ids per version and consumed ids per update, as the recording controller decides them."""
    book = StalenessBook(P, eta, U * P)
    admitted = [list(book.admit(0))]
    consumed, order, u = [], list(finish_order), 0
    running = set(admitted[0])
    while u < U:
        batch = book.take(u)
        if batch is None:
            j = order.pop(0)
            if j not in running:  # not started yet: it finishes later
                order.append(j)
                continue
            running.discard(j)
            book.finish(("train", j), 0, [])
            continue
        consumed.append(sorted(tag[1] for tag, _i, _c in batch))
        u += 1
        new = list(book.admit(u))
        admitted.append(new)
        running.update(new)
    return admitted, consumed


def _simulator(P, eta, U, finish_order):
    """The same, as the simulator's gate and consumption rule decide them."""
    env = simpy.Environment()
    NP = U * P
    pv = np.full(NP, NOT_STARTED, np.int64)
    gate, groups = AdmissionGate(P, eta, pv), FinishedGroups(env, P, eta, pv)

    def pull(v):
        lo0 = gate.started
        while gate.is_open(v) and gate.started < NP:
            gate.pull(v, NP)
        return list(range(lo0, gate.started))

    admitted, consumed = [pull(0)], []

    def trainer():
        for u in range(U):
            picked = yield from groups.take(u)
            consumed.append(sorted(picked.tolist()))
            admitted.append(pull(u + 1))

    env.process(trainer())
    env.run()
    order = list(finish_order)
    while len(consumed) < U:
        j = order.pop(0)
        if pv[j] == NOT_STARTED:
            order.append(j)
            continue
        groups.put(np.array([j]))
        env.run()
    return admitted, consumed


@pytest.mark.parametrize("eta", [0, 1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_runner_and_simulator_admit_and_consume_the_same_prompts(eta, seed):
    P, U = 3, 6
    finish_order = np.random.default_rng(seed).permutation(U * P).tolist()
    run_admitted, run_consumed = _runner(P, eta, U, finish_order)
    sim_admitted, sim_consumed = _simulator(P, eta, U, finish_order)
    assert run_consumed == sim_consumed
    assert run_admitted == sim_admitted
    start = {j: v for v, ids in enumerate(run_admitted) for j in ids}
    assert all(u - start[j] <= eta for u, ids in enumerate(run_consumed) for j in ids)  # the limit holds
    assert sorted(j for ids in run_consumed for j in ids) == list(range(U * P))
