"""Shared fixtures. Compiled programs are cached on disk by httpstan (and in
memory per process), so each distinct program compiles once per machine.

A test that compiles or loads a Stan program carries the ``stan`` marker (a file of such
tests sets ``pytestmark``), so ``pytest -m "not stan"`` is a quick loop without a compiler.
An unmarked test that reaches an engine's compile step fails and names the marker
(:func:`pytest_runtest_setup` and :func:`_refuse_unmarked`), so the marking stays complete.
"""

import os
import warnings

import numpy as np
import pytest

warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")

# ArviZ 0.23 writes a once-a-day stamp file as it is first imported; two pytest-xdist workers doing so at
# once race on its temporary file (FileNotFoundError at collection). Importing it here, in the process
# that starts the workers, writes the stamp before they exist.
import arviz  # noqa: E402, F401

import robust_stan as rs  # noqa: E402  (after the filter: ArviZ warns as it is imported)

ENGINE = os.environ.get("ROBUST_STAN_TEST_ENGINE", "httpstan")

# The suite's httpstan builds are compiled at -O1 (ROBUST_STAN_CXXFLAGS, after httpstan's -O3): about a fifth
# less compile time, which is most of the suite's, for somewhat slower sampling. GCC and clang compute the same
# IEEE values at every -O level (no -ffast-math), so a test's claim holds for the users' -O3 builds too;
# test_engines.py checks it on one program (with the statistical studies: it needs builds of its own), and the
# demo builds at -O3 in CI. ROBUST_STAN_CXXFLAGS="" runs the suite on -O3 builds. test_robustify.py compiles the
# builds it only evaluates at a few points at -O0 (its _compile).
os.environ.setdefault("ROBUST_STAN_CXXFLAGS", "-O1")

_RUNNING = {"test": None, "stan": True}  # the test being set up or run, and whether it is marked ``stan``


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the item's fixtures (session fixtures that compile included) are set up."""
    _RUNNING.update(test=item.nodeid, stan=item.get_closest_marker("stan") is not None)


def _refuse_unmarked(compile_with):
    def guarded(*args, **kwargs):
        if not _RUNNING["stan"]:
            raise AssertionError(f"{_RUNNING['test']} compiles or loads a Stan program: mark it with "
                                 "@pytest.mark.stan (or the file with pytestmark = pytest.mark.stan)")
        return compile_with(*args, **kwargs)
    return guarded


def pytest_collection_modifyitems(config, items):
    """Tests that need CmdStan or BridgeStan (their skip condition says so) are ``stan`` tests too:
    the guard below cannot see them where those engines are absent, as on CI."""
    for item in items:
        reasons = " ".join(str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))
        if "CmdStan is not installed" in reasons or "BridgeStan" in reasons:
            item.add_marker(pytest.mark.stan)


def pytest_sessionstart(session):
    import robust_stan.engines as engines

    engines.compile_httpstan = _refuse_unmarked(engines.compile_httpstan)
    engines.compile_cmdstan = _refuse_unmarked(engines.compile_cmdstan)


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
