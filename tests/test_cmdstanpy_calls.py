"""Every call robust-stan makes into CmdStanPy binds to the installed CmdStanPy's signatures.

No CmdStan is needed: a stand-in for ``cmdstanpy.CmdStanModel`` records the calls the CmdStan
engine and Stan's methods make, and each is bound to the real method's ``inspect.signature``,
so a keyword CmdStanPy does not have (``init`` for ``inits``, an argument a method does not
take) fails here in CI instead of only where CmdStan is installed.
"""

import inspect
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest

cmdstanpy = pytest.importorskip("cmdstanpy")

from robust_stan.common.resources import NATIVE_FILE  # noqa: E402
from robust_stan.engines import cmdstan_engine  # noqa: E402
from robust_stan.engines.base import NutsSettings  # noqa: E402
from robust_stan.methods import stan_methods  # noqa: E402


class StandInResult:
    """Just enough of a CmdStanPy result for robust-stan's code after each call."""

    metadata = SimpleNamespace(stan_vars={})
    num_draws_sampling = 1
    column_names = ()
    columns = ()
    variational_sample = np.zeros((1, 0))
    runset = SimpleNamespace(stdout_files=[])

    def method_variables(self):
        return {}

    def draws(self):
        return np.zeros((1, 0))


class StandInModel:
    """Records every method call (and the construction) as (name, args, kwargs)."""

    calls: ClassVar[list] = []

    def __init__(self, *args, **kwargs):
        StandInModel.calls.append(("__init__", args, kwargs))
        self.exe_file = "/nowhere/program"

    def __getattr__(self, name):
        def method(*args, **kwargs):
            StandInModel.calls.append((name, args, kwargs))
            return StandInResult()
        return method


@pytest.fixture
def recorded():
    StandInModel.calls = []
    return StandInModel.calls


def assert_binds(calls):
    """Each recorded call binds to CmdStanModel's method of that name (TypeError names the keyword)."""
    assert calls
    for name, args, kwargs in calls:
        signature = inspect.signature(getattr(cmdstanpy.CmdStanModel, name))
        try:
            signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise AssertionError(f"CmdStanModel.{name}{signature} does not take {sorted(kwargs)}: {exc}") from None


DATA = {"N": 2, "y": [0.5, 1.5]}
INIT = {"mu_copies": np.array([0.1])}


def test_nuts_and_the_fixed_parameter_draw(recorded):
    program = cmdstan_engine.CmdStanProgram("", StandInModel())
    program.sample(DATA, NutsSettings(chains=2, seed=3), inits=[INIT, INIT])
    program.unconstrained_dimension(DATA)  # a fixed-parameter draw, then log_prob
    assert [name for name, _, _ in recorded[1:]] == ["sample", "sample", "log_prob"]
    assert recorded[1][2]["sig_figs"] == cmdstan_engine.SIG_FIGS
    assert_binds(recorded[1:])


@pytest.mark.parametrize("native", [False, True], ids=["plain", "native-losses"])
def test_the_model_is_constructed_with_cmdstanpys_arguments(recorded, monkeypatch, tmp_path, native):
    monkeypatch.setattr(cmdstanpy, "CmdStanModel", StandInModel)
    monkeypatch.setenv("ROBUST_STAN_CACHE", str(tmp_path))
    code = (f"#include {NATIVE_FILE}\n" if native else "") + "parameters { real mu; }\nmodel { mu ~ normal(0, 1); }\n"
    cmdstan_engine.compile_cmdstan(code, show_progress=False)
    assert recorded[0][0] == "__init__" and (recorded[0][2]["user_header"] is not None) == native
    monkeypatch.undo()
    assert_binds(recorded)


@pytest.mark.parametrize("method, options", [
    ("advi", {"iter": 200, "tol_rel_obj": 1e-3}),
    ("advi", {"require_converged": True}),
    ("pathfinder", {"num_paths": 2}),
    ("laplace", {"jacobian": True}),
    ("laplace", {"opt_args": {"algorithm": "lbfgs"}}),
])
@pytest.mark.parametrize("init", [None, INIT], ids=["no-init", "init"])
def test_stan_methods(recorded, method, options, init):
    stan_methods._call_cmdstanpy(StandInModel(), method, DATA, "fullrank", 100, 5, init, dict(options))
    name, _, kwargs = recorded[-1]
    assert name == {"advi": "variational", "pathfinder": "pathfinder", "laplace": "laplace_sample"}[method]
    assert kwargs["sig_figs"] == cmdstan_engine.SIG_FIGS
    if method == "advi":
        assert kwargs["require_converged"] is options.get("require_converged", False)
    if method == "laplace" and init is not None:  # laplace_sample takes no inits: they start the optimizer
        assert kwargs["opt_args"]["inits"] is init
        optimize = inspect.signature(cmdstanpy.CmdStanModel.optimize)
        optimize.bind(None, data=DATA, **kwargs["opt_args"])
    elif init is not None:
        assert kwargs["inits"] is init
    assert_binds(recorded[1:])


def test_laplace_refuses_an_init_beside_a_mode():
    with pytest.raises(stan_methods.RobustStanInputError, match="init"):
        stan_methods._call_cmdstanpy(StandInModel(), "laplace", DATA, "meanfield", 100, 5, INIT, {"mode": "m.csv"})
