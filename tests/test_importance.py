"""PSIS through ArviZ on both ArviZ lines: the smoothed weights and k-hat of log importance ratios."""

import numpy as np

from robust_stan.methods.importance import psis


def test_khat_of_a_known_tail():
    """Ratios r = U^(-0.8) have a Pareto tail with shape k = 0.8 exactly. PSIS fits the largest
    M = 3 sqrt(S) = 424 of S = 20,000 ratios; the estimate's sd is about (1 + k) / sqrt(M) = 0.09,
    so 0.8 +- 0.35 is four sds. (ArviZ 1.x smooths exp(-input): handing it the ratios as they are
    gives the other tail, k-hat near -1, which this catches.)"""
    u = np.random.default_rng(0).random(20_000)
    _, khat = psis(-0.8 * np.log(u))
    assert abs(khat - 0.8) < 0.35, khat


def test_light_tail_weights_are_normalised_and_follow_the_ratios():
    log_ratios = np.random.default_rng(1).normal(scale=0.3, size=(4, 1000))
    log_weights, khat = psis(log_ratios)
    assert log_weights.shape == log_ratios.shape
    assert khat < 0.5
    assert np.isclose(np.exp(log_weights).sum(), 1.0, rtol=1e-12)
    # smoothing only replaces the largest ratios: the order of the weights is the order of the ratios
    order = np.argsort(log_ratios.ravel())
    assert np.all(np.diff(log_weights.ravel()[order]) >= -1e-12)
