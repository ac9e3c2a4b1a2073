"""The public entry points check and convert their arguments once, and pass typed objects down."""

import subprocess
import sys
import warnings

import numpy as np
import pytest

import robust_stan as rs
from robust_stan.building import data as data_module, divergences as divergences_module

from .conftest import regression_data


@pytest.fixture
def conversions(monkeypatch):
    """Counts of prepare_data and as_divergence calls, wherever in the package they are made from."""
    counts = {"prepare_data": 0, "as_divergence": 0}
    originals = {"prepare_data": data_module.prepare_data, "as_divergence": divergences_module.as_divergence}

    def counted(name):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return originals[name](*args, **kwargs)
        return wrapper

    for module in [m for n, m in sys.modules.items() if n.startswith("robust_stan.")]:
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counted(name))
    return counts


ENTRY_POINTS = {
    "sample": lambda model, data: model.sample(data, rs.BetaD(0.3), chains=2, iter_warmup=20, iter_sampling=20,
                                               seed=1, show_progress=False),
    "variational": lambda model, data: model.variational(data, rs.BetaD(0.3), iter=20, eval_elbo=10, draws=5,
                                                         seed=1, show_progress=False),
    "rob_ula": lambda model, data: rs.rob_ula(model, data, contamination=0.1, divergence=rs.BetaD(0.3),
                                              iter_sampling=20, iter_warmup=0, chains=2, seed=1, show_progress=False),
}


@pytest.mark.stan
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_public_call_converts_the_divergence_and_prepares_the_data_once(glm_normal, conversions, entry):
    data, _, _, _ = regression_data(n=40, p=2, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 20 draws do not converge; only the counts matter here
        ENTRY_POINTS[entry](glm_normal, data)
    assert conversions == {"prepare_data": 1, "as_divergence": 1}


def test_the_public_namespace_uses_nothing_deprecated():
    """`import robust_stan` and every rs. name work with DeprecationWarnings as errors."""
    code = "import robust_stan as rs; [getattr(rs, n) for n in rs.__all__]"
    result = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_select_divergence_names_every_option_in_its_signature():
    """NUTS settings are named parameters (CmdStanPy's names), so a wrong keyword is refused by name."""
    import inspect

    parameters = inspect.signature(rs.select_divergence).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    assert {"chains", "iter_warmup", "iter_sampling", "thin", "seed", "adapt_delta", "max_treedepth",
            "show_progress"} <= set(parameters)
    with pytest.raises(TypeError, match="unexpected keyword argument 'divergence'"):
        rs.select_divergence(rs.glm("normal"), {}, divergence=rs.BetaD(0.3))


def test_variational_names_every_option_and_sends_each_to_the_method_that_takes_it():
    """A model's variational has no **options: the driver's and ADVI's shared options (CmdStanPy's names),
    the driver's own, and stan_options for the rest of CmdStanPy's arguments; one the chosen method does
    not take is refused by name."""
    import inspect

    from robust_stan.methods.variational.options import VariationalOptions

    for model_class in (rs.Model, rs.StanProgramModel):
        parameters = inspect.signature(model_class.variational).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        assert {"iter", "grad_samples", "elbo_samples", "eta", "tol_rel_obj", "eval_elbo", "batch_size",
                "stan_options"} <= set(parameters)
    options = VariationalOptions(iter=10, oracle="httpstan")
    assert options.for_method("robust-stan") == {"iter": 10, "oracle": "httpstan"}
    assert VariationalOptions(iter=10, stan_options={"mode": "m.csv"}).for_method("advi") == {"iter": 10,
                                                                                             "mode": "m.csv"}
    assert VariationalOptions().for_method("pathfinder") == {}
    with pytest.raises(rs.RobustStanInputError, match="^oracle: options of robust-stan's driver"):
        options.for_method("advi")
    with pytest.raises(rs.RobustStanInputError, match="^iter: options of ADVI and robust-stan's driver"):
        VariationalOptions(iter=10).for_method("laplace")
    with pytest.raises(rs.RobustStanInputError, match="^stan_options: for Stan's methods"):
        VariationalOptions(stan_options={"mode": "m.csv"}).for_method("robust-stan")
    with pytest.raises(TypeError, match="unexpected keyword argument 'grad_sample'"):
        rs.glm("normal").variational({}, grad_sample=3)


def test_nuts_settings_check_themselves():
    """NutsSettings checks its values when made, naming the argument, as CmdStanPy's SamplerArgs.validate
    does; every path that runs NUTS (a model's sample, the coresets, calibration, the noise-aware model)
    makes one."""
    from robust_stan.engines import NutsSettings

    settings = NutsSettings(chains=np.int64(2), adapt_delta=0.9, seed=np.int64(7))
    assert type(settings.chains) is int and type(settings.seed) is int and settings.adapt_delta == 0.9
    for kwargs, match in (({"chains": 0}, r"^chains: must be an integer >= 1"),
                          ({"iter_warmup": -1}, r"^iter_warmup: must be an integer >= 0"),
                          ({"thin": 1.5}, r"^thin: must be an integer >= 1"),
                          ({"seed": -3}, r"^seed: must be an integer >= 0"),
                          ({"adapt_delta": 1.0}, r"^adapt_delta: must lie in \(0, 1\)"),
                          ({"adapt_delta": True}, r"^adapt_delta: must lie in \(0, 1\)")):
        with pytest.raises(rs.RobustStanInputError, match=match):
            NutsSettings(**kwargs)


def test_rob_ula_and_variational_settings_check_themselves():
    """RobULASettings and VariationalSettings check their values when made, naming the argument, before
    the run fills in what it chose (the step size and estimator; the steps taken and convergence)."""
    from dataclasses import replace

    from robust_stan.methods.rob_ula.sampler import RobULASettings
    from robust_stan.methods.variational.robust_vi import VariationalSettings

    rob_ula = RobULASettings(4, 500, 1000, 1, None, 0.1, "", None, False)
    assert replace(rob_ula, estimator="row_trimmed_mean", step_size=0.2).step_size == 0.2
    for change, match in (({"contamination": 0.5}, r"^contamination: must lie in \[0, 0.5\)"),
                          ({"chains": 0}, r"^chains: must be an integer >= 1"),
                          ({"step_size": 0.0}, r"^step_size: must be positive"),
                          ({"metric": "full"}, r"^metric: must be one of dense, diag, unit"),
                          ({"seed": -1}, r"^seed: must be a non-negative integer or None")):
        with pytest.raises(rs.RobustStanInputError, match=match):
            replace(rob_ula, **change)
    variational = VariationalSettings("meanfield", 1000, 5, 100, 0.05, 10_000, 1e-5, 100, None, None, False)
    assert replace(variational, iterations_run=300, converged=True).converged
    for change, match in (({"family": "flow"}, r"^family: the variational driver knows"),
                          ({"elbo_samples": 1}, r"^elbo_samples: must be an integer >= 2"),
                          ({"eta": -1.0}, r"^eta: must be positive"),
                          ({"batch_size": 0}, r"^batch_size: must be an integer >= 1")):
        with pytest.raises(rs.RobustStanInputError, match=match):
            replace(variational, **change)
