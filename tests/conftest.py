"""Shared fixtures. Compiled programs are cached on disk by httpstan (and in
memory per process), so each distinct program compiles once per machine."""

import os
import warnings

import numpy as np
import pytest

warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")

import robust_stan as rs

ENGINE = os.environ.get("ROBUST_STAN_TEST_ENGINE", "httpstan")


@pytest.fixture(scope="session")
def engine():
    """Engine the suite runs on (httpstan unless ROBUST_STAN_TEST_ENGINE says otherwise)."""
    return ENGINE


@pytest.fixture(scope="session")
def glm_normal():
    """The normal glm, fitted on the outcome's own scale (exact-value tests)."""
    model = rs.glm("normal", standardize=False, engine=ENGINE)
    model.compile(show_progress=False)
    return model


@pytest.fixture(scope="session")
def glm_normal_standardized():
    """The normal glm as users get it by default (outcome standardised)."""
    model = rs.glm("normal", engine=ENGINE)
    model.compile(show_progress=False)
    return model


def regression_data(n=200, p=3, outlier_fraction=0.1, seed=1, shift_sd=10.0):
    """Linear regression y = 1 + X b + N(0, 1), the first rows shifted by shift_sd sds."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    b = np.linspace(-1.0, 1.0, p) * 2
    y_clean = 1.0 + X @ b + rng.normal(size=n)
    y = y_clean.copy()
    n_out = int(round(outlier_fraction * n))
    y[:n_out] += shift_sd * y_clean.std()
    return {"X": X, "y": y}, {"X": X, "y": y_clean}, b, n_out


def check_seed_is_recorded_truly(run, variable: str, seed: int = 5):
    """``run(seed)`` fits something. A run with seed=None draws a fresh seed and records None (it
    cannot be repeated): two such runs differ. A run with ``seed`` records it and repeats exactly.
    Returns one of the runs without a seed."""
    unseeded = [run(None) for _ in range(2)]
    assert [fit.settings.seed for fit in unseeded] == [None, None]
    assert not np.array_equal(unseeded[0].draws(variable), unseeded[1].draws(variable))
    seeded = [run(seed) for _ in range(2)]
    assert [fit.settings.seed for fit in seeded] == [seed, seed]
    np.testing.assert_array_equal(seeded[0].draws(variable), seeded[1].draws(variable))
    return unseeded[0]
