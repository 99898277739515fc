"""The numpy NNLS (replay.robust.nnls, nnls_gram) against scipy.optimize.nnls and the optimality conditions."""
import numpy as np
import pytest
from scipy.optimize import nnls as scipy_nnls

from rlsim.replay.robust import nnls, nnls_gram, nnls_gram_many


def _kkt_ok(A, b, x, tol=1e-8):
    """x >= 0; the gradient A'(Ax - b) is 0 where x > 0 and >= 0 where x = 0 (relative to its scale)."""
    grad = A.T @ (A @ x - b)
    scale = np.abs(A.T @ b).max() + 1e-300
    return (x >= 0).all() and np.all(np.abs(grad[x > 0]) <= tol * scale) and np.all(grad[x == 0] >= -tol * scale)


@pytest.mark.parametrize("seed", range(200))
def test_matches_scipy_on_random_full_rank_problems(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    m = n + int(rng.integers(0, 40))
    A = rng.normal(size=(m, n)) * rng.uniform(0.1, 10, n)  # columns of unlike scale
    b = rng.normal(size=m) + A @ rng.normal(size=n)  # a truth with negative coefficients: some bounds bind
    x, ref = nnls(A, b), scipy_nnls(A, b)[0]
    assert _kkt_ok(A, b, x)
    assert np.allclose(x, ref, rtol=1e-8, atol=1e-10 * np.abs(ref).max(initial=1.0))


def test_interior_solution_is_the_unconstrained_one():
    A = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    x_true = np.array([2.0, 3.0])
    assert np.allclose(nnls(A, A @ x_true), x_true)


def test_a_bound_that_binds_by_hand():
    # min (x1 - 1)^2 + (x2 + 1)^2: x2 wants -1, the bound holds it at 0
    assert np.allclose(nnls_gram(np.eye(2), np.array([1.0, -1.0])), [1.0, 0.0])
    # coupled: G = [[2, 1], [1, 2]], g = [1, -2]; unconstrained (4/3, -5/3); with x2 = 0, x1 = g1 / G11 = 0.5
    assert np.allclose(nnls_gram(np.array([[2.0, 1.0], [1.0, 2.0]]), np.array([1.0, -2.0])), [0.5, 0.0])


def test_zero_and_collinear_columns():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(30, 4))
    A[:, 1] = 0.0  # a feature that is always 0 (no prefill in these rows)
    A[:, 3] = 2 * A[:, 2]  # two features in proportion: the solution is not unique, the fit is
    b = A @ np.array([1.0, 0.0, 0.5, 0.5]) + 0.01 * rng.normal(size=30)
    x = nnls(A, b)
    assert x[1] == 0 and _kkt_ok(A, b, x)
    assert np.isclose(np.sum((A @ x - b) ** 2), np.sum((A @ scipy_nnls(A, b)[0] - b) ** 2), rtol=1e-9)


def test_all_bounds_binding_and_empty():
    A = np.array([[1.0, 1.0], [1.0, 2.0]])
    assert np.array_equal(nnls(A, np.array([-1.0, -1.0])), [0.0, 0.0])
    assert nnls_gram(np.zeros((0, 0)), np.zeros(0)).shape == (0,)


@pytest.mark.parametrize("seed", range(50))
def test_underdetermined_problems_reach_scipys_objective(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    A = rng.normal(size=(int(rng.integers(1, n + 1)), n))
    b = rng.normal(size=len(A))
    x = nnls(A, b)
    best = np.sum((A @ scipy_nnls(A, b)[0] - b) ** 2)
    assert (x >= 0).all() and np.sum((A @ x - b) ** 2) <= best + 1e-8 * np.sum(b ** 2)


def test_a_stack_is_solved_as_each_alone():
    rng = np.random.default_rng(7)
    Gs, gs = [], []
    for k in range(40):
        A = rng.normal(size=(12, 5)) * rng.uniform(0.1, 10, 5)
        if k % 7 == 0:
            A[:, 2] = 0.0  # a zero column in some problems
        if k % 11 == 0:
            A[:, 4] = A[:, 3]  # collinear columns in others
        b = A @ rng.normal(size=5) + rng.normal(size=12)
        Gs.append(A.T @ A)
        gs.append(A.T @ b)
    many = nnls_gram_many(np.array(Gs), np.array(gs))
    for x, G, g in zip(many, Gs, gs):
        one = nnls_gram(G, g)
        assert (x >= 0).all() and np.isclose(x @ G @ x - 2 * g @ x, one @ G @ one - 2 * g @ one, rtol=1e-9, atol=1e-9)
    assert nnls_gram_many(np.zeros((0, 3, 3)), np.zeros((0, 3))).shape == (0, 3)


def test_exactly_collinear_columns_keep_one_at_zero_as_scipy_does():
    # an intercept and a constant feature (every step the same length): no single solution; Lawson-Hanson keeps
    # one of the two at 0, which the fits read as "not identified" (fit_steps' roofline prior)
    rng = np.random.default_rng(5)
    x = rng.uniform(200, 300, 9)
    A = np.column_stack([np.ones(9), np.full(9, 20.0), x])
    A = A / np.linalg.norm(A, axis=0)
    b = A @ np.array([3.0, 2.0, 1.0]) + 1e-3 * rng.normal(size=9)
    mine, ref = nnls(A, b), scipy_nnls(A, b)[0]
    assert min(mine[0], mine[1]) == 0 and np.allclose(mine, ref, rtol=1e-8, atol=1e-10)
