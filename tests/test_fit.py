"""Fit objects: shapes, summaries, ArviZ groups and dims, reproducibility, original-scale results."""

import numpy as np
import pytest
from scipy import stats

import robust_stan as rs
from robust_stan.results.arviz_output import group_names

from .conftest import ENGINE, regression_data

SHORT = dict(chains=2, iter_warmup=300, iter_sampling=200, show_progress=False)


@pytest.fixture(scope="module")
def beta_fit(glm_normal_standardized):
    data, _, _, _ = regression_data(n=80, p=3)
    return glm_normal_standardized.sample(data, divergence=rs.BetaD(0.3), seed=5, **SHORT), data


@pytest.mark.stan
def test_draws_and_summary(beta_fit):
    fit, _data = beta_fit
    assert fit.draws("b").shape == (2, 200, 3)
    assert fit.draws("alpha").shape == (2, 200)
    assert fit.draws("log_lik").shape == (2, 200, 80)
    summary = fit.summary()
    assert list(summary.index) == ["alpha", "b[1]", "b[2]", "b[3]", "sigma"]
    assert {"mean", "sd", "5%", "50%", "95%", "mcse_mean", "ess_bulk", "ess_tail", "r_hat"} <= set(summary.columns)
    with pytest.raises(rs.RobustStanInputError, match="name"):
        fit.draws("nonexistent")


@pytest.mark.stan
def test_to_arviz_groups_and_dims(beta_fit):
    fit, data = beta_fit
    idata = fit.to_arviz()
    # a beta fit: log p(y_i | theta) in model_log_likelihood, not log_likelihood (tests/test_loo.py)
    assert {"posterior", "sample_stats", "model_log_likelihood", "posterior_predictive", "observed_data",
            "constant_data", "robust_loss"} <= set(group_names(idata))
    assert idata.posterior["b"].dims == ("chain", "draw", "predictor")
    assert idata["model_log_likelihood"]["y"].dims == ("chain", "draw", "obs")
    assert idata.observed_data["y"].shape == (80,)
    assert idata.sample_stats["diverging"].dtype == bool
    np.testing.assert_allclose(idata.observed_data["y"].values, data["y"])


@pytest.mark.stan
def test_to_arviz_is_the_installed_arviz_own_object_and_arviz_works_on_it(beta_fit):
    """InferenceData on ArviZ 0.x, DataTree on ArviZ 1.x; summary and trace plots run on it, and
    ArviZ's compare on fit.loo() (arviz.loo refuses a robust fit's object, tests/test_loo.py)."""
    import arviz as az
    import matplotlib
    import xarray as xr
    from scipy.special import logsumexp

    from robust_stan.results.arviz_output import arviz_major

    matplotlib.use("Agg")
    fit, _ = beta_fit
    idata = fit.to_arviz()
    assert isinstance(idata, xr.DataTree if arviz_major() >= 1 else az.InferenceData)
    loo = fit.loo()
    elpd, se = (loo.elpd, loo.se) if arviz_major() >= 1 else (loo["elpd_loo"], loo["se"])
    # plain importance-sampling LOO with the same ratios exp(l_i): PSIS differs from it only by its smoothed tails
    log_lik, loss = (fit.draws(name).reshape(-1, 80) for name in ("log_lik", "robust_loss"))
    plain = float(np.sum(logsumexp(loss + log_lik, axis=0) - logsumexp(loss, axis=0)))
    assert abs(elpd - plain) < se
    assert len(az.compare({"beta": loo, "again": fit.loo()})) == 2
    summary = az.summary(idata, var_names=["b"])
    np.testing.assert_allclose(np.asarray(summary["mean"], dtype=float), fit.draws("b").mean(axis=(0, 1)), atol=1e-2)
    az.plot_trace(idata, var_names=["b"])
    matplotlib.pyplot.close("all")


@pytest.mark.stan
def test_summary_diagnostics_are_arvizs_own(beta_fit):
    """fit.summary() gives ArviZ's bulk/tail ESS, R-hat and MCSE of each scalar, on either ArviZ line."""
    import arviz as az

    fit, _ = beta_fit
    x = fit.draws("alpha")
    row = fit.summary().loc["alpha"]
    assert row["ess_bulk"] == pytest.approx(float(az.ess(x, method="bulk")), rel=1e-12)
    assert row["ess_tail"] == pytest.approx(float(az.ess(x, method="tail", prob=(0.05, 0.95))), rel=1e-12)
    assert row["r_hat"] == pytest.approx(float(az.rhat(x)), rel=1e-12)
    assert row["mcse_mean"] == pytest.approx(float(az.mcse(x, method="mean")), rel=1e-12)


@pytest.mark.stan
def test_same_seed_same_draws(glm_normal_standardized):
    data, _, _, _ = regression_data(n=50, p=2, seed=3)
    a = glm_normal_standardized.sample(data, divergence=rs.GammaD(0.2), seed=9, **SHORT)
    b = glm_normal_standardized.sample(data, divergence=rs.GammaD(0.2), seed=9, **SHORT)
    c = glm_normal_standardized.sample(data, divergence=rs.GammaD(0.2), seed=10, **SHORT)
    np.testing.assert_array_equal(a.draws("b"), b.draws("b"))
    assert not np.array_equal(a.draws("b"), c.draws("b"))


@pytest.mark.stan
def test_standardised_glm_reports_original_scale(beta_fit):
    """log_lik recomputed with SciPy from the reported (original-scale) draws equals the fit's."""
    fit, data = beta_fit
    mu = fit.draws("alpha")[..., None] + np.einsum("cdp,np->cdn", fit.draws("b"), data["X"])
    expected = stats.norm.logpdf(data["y"], mu, fit.draws("sigma")[..., None])
    np.testing.assert_allclose(fit.draws("log_lik"), expected, rtol=1e-8, atol=1e-8)
    # predictive draws live on the data's scale too
    assert abs(np.median(fit.draws("y_rep")) - np.median(data["y"])) < 2 * np.std(data["y"])


@pytest.mark.stan
def test_standardised_exponential_reports_original_scale():
    rng = np.random.default_rng(2)
    y = rng.exponential(scale=250.0, size=60)
    # test_dpvi's prior, so the suite compiles this program once (standardising changes the data, not the program)
    model = rs.location("exponential", priors={"rate": "gamma(2, 2)"}, engine=ENGINE)
    fit = model.sample({"y": y}, divergence=rs.BetaD(0.2), seed=3, **SHORT)
    expected = stats.expon.logpdf(y, scale=1 / fit.draws("rate")[..., None])
    np.testing.assert_allclose(fit.draws("log_lik"), expected, rtol=1e-8, atol=1e-8)
    assert 1 / 600 < fit.draws("rate").mean() < 1 / 100


@pytest.mark.stan
def test_inits_are_given_on_the_original_scale(glm_normal_standardized):
    from robust_stan.building.data import prepare_data

    data, _, _, _ = regression_data(n=50, p=2, seed=4)
    _, scaling = prepare_data(glm_normal_standardized.spec, data)
    inits = glm_normal_standardized.chain_inits({"alpha": 1.0, "b": [0.5, 0.0], "sigma": 2.0}, 2, scaling)
    assert len(inits) == 2
    np.testing.assert_allclose(inits[0]["alpha_copies"], [(1.0 - scaling.center) / scaling.scale])
    np.testing.assert_allclose(inits[0]["b_copies"], [[0.5 / scaling.scale, 0.0]])
    np.testing.assert_allclose(inits[1]["sigma_copies"], [2.0 / scaling.scale])
    fit = glm_normal_standardized.sample(data, inits={"alpha": 1.0, "b": [0.5, 0.0], "sigma": 2.0}, seed=1, **SHORT)
    assert fit.diagnostics()["max_r_hat"] < 1.05
    with pytest.raises(rs.RobustStanInputError, match="inits"):
        glm_normal_standardized.sample(data, inits={"gamma": 1.0}, **SHORT)


def test_mcse_of_the_sd_by_the_delta_method():
    """For independent N(0, 1) draws the sd of s is 1 / sqrt(2 n); mcse_sd estimates it (the
    ESS of the centred squares is about n here), within 5%: the ESS estimate of 40000 draws
    is itself noisy by a few percent."""
    from robust_stan.results.arviz_output import mcse_sd

    draws = np.random.default_rng(2).normal(size=(4, 10000))
    assert mcse_sd(draws) == pytest.approx(1 / np.sqrt(2 * draws.size), rel=0.05)


@pytest.mark.stan
def test_defaults_on_a_plain_regression_converge_without_a_warning(glm_normal_standardized):
    """NUTS with every default (4 chains x 1000 + 1000) on an ordinary regression: R-hat at most
    1.01 and bulk/tail ESS at least 100 for every parameter, so no convergence warning."""
    import warnings

    data, _, _, _ = regression_data(n=100, p=3, outlier_fraction=0.0, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rs.RobustStanWarning)
        fit = glm_normal_standardized.sample(data, seed=2, show_progress=False)
    summary = fit.summary()
    assert summary["r_hat"].max() <= 1.01 and summary[["ess_bulk", "ess_tail"]].min().min() >= 100


@pytest.mark.stan
def test_a_run_too_short_to_converge_says_so(glm_normal_standardized):
    data, _, _, _ = regression_data(n=50, p=2, seed=4)
    with pytest.warns(rs.RobustStanWarning, match=r"^nuts: the chains have not converged for .*smallest bulk ESS"):
        glm_normal_standardized.sample(data, chains=2, iter_warmup=20, iter_sampling=15, seed=1, show_progress=False)


@pytest.mark.stan
def test_nuts_writes_parameters_only_and_the_pointwise_quantities_come_on_demand(beta_fit):
    """The sampler's output holds no per-observation array; the first access computes log_lik,
    robust_loss and y_rep from the kept draws, equal to the program's own write_array at each
    draw (the path robust-stan used before, one call per draw) to 1e-12."""
    fit, data = beta_fit
    fresh = type(fit)(fit.model, fit.raw, fit.model.prepare(data, fit.divergence), fit.settings)
    assert all(fresh.raw.variables.get(name, np.empty(0)).size == 0 for name in ("log_lik", "robust_loss", "y_rep"))
    assert fresh._pointwise is None
    oracle = fit.model.oracle_for(fit.stan_data)
    for c, t in [(0, 0), (0, 57), (1, 199)]:
        copies = {f"{name}_copies": np.asarray([fit.raw.variables[name][c, t]]) for name in ("alpha", "b", "sigma")}
        reference = oracle.constrain(oracle.unconstrain(copies), include_gqs=True)
        np.testing.assert_allclose(fresh.robust_loss[c, t], reference["robust_loss"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(fresh.log_lik[c, t] + np.log(fit.scaling.scale), reference["log_lik"],
                                   rtol=1e-12, atol=1e-12)
    assert fresh._pointwise is not None and fresh.y_rep is fresh._pointwise["y_rep"]["y"]  # computed once, kept


@pytest.mark.stan
def test_y_rep_comes_from_a_stream_per_chain_seeded_by_the_fit(beta_fit):
    """y_rep is reproducible from the fit's seed, fresh at every draw and in every chain, and
    distributed as the model says: standardised residuals (y_rep - mu) / sigma have mean 0 and
    sd 1 (400 draws x 80 rows; 4 Monte Carlo sds of each, rows treated as independent)."""
    fit, data = beta_fit
    again = type(fit)(fit.model, fit.raw, fit.model.prepare(data, fit.divergence), fit.settings)
    np.testing.assert_array_equal(again.y_rep, fit.y_rep)
    mu = fit.draws("alpha")[..., None] + np.einsum("cdp,np->cdn", fit.draws("b"), data["X"])
    z = (fit.y_rep - mu) / fit.draws("sigma")[..., None]
    assert abs(z.mean()) < 4 / np.sqrt(z.size) and abs(z.std() - 1) < 4 / np.sqrt(2 * z.size)
    assert not np.allclose(z[0, 0], z[0, 1]) and not np.allclose(z[0, 0], z[1, 0])
