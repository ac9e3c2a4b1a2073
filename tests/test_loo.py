"""fit.loo(): PSIS-LOO of a generalized posterior, whose importance ratios are exp(w v_i l_i(theta))
and whose predictive density is p(y_i | theta), as ArviZ's own ELPD result on either ArviZ line;
to_arviz() keeps log p(y_i | theta) out of ArviZ's log_likelihood group where arviz.loo would be wrong."""

import numpy as np
import pytest
from scipy.special import logsumexp

import robust_stan as rs
from robust_stan.results.arviz_output import arviz_major, group_names
from robust_stan.results.loo import MODEL_LOG_LIKELIHOOD, relative_efficiency

from .conftest import ENGINE, regression_data
from .test_robustify import _linear_regression, _program

pytestmark = pytest.mark.stan  # every test here compiles or loads a Stan program

N = 80
RUN = dict(chains=4, iter_warmup=1000, iter_sampling=1000, show_progress=False)
#: Rows scored against exact leave-one-out refits: an outlier (rows 0-7 are shifted) and two clean rows.
REFIT_ROWS = (0, 30, 61)


def _fields(result) -> dict:
    """elpd, se, p, pointwise elpd and Pareto k of an ELPD result of either ArviZ line."""
    if arviz_major() >= 1:
        return {"elpd": result.elpd, "se": result.se, "p": result.p, "elpd_i": np.asarray(result.elpd_i),
                "pareto_k": np.asarray(result.pareto_k)}
    return {"elpd": result["elpd_loo"], "se": result["se"], "p": result["p_loo"],
            "elpd_i": np.asarray(result["loo_i"]), "pareto_k": np.asarray(result["pareto_k"])}


def _importance_sampling_elpd(log_lik, log_ratios, reff):
    """NumPy, without ArviZ: self-normalised importance sampling of each row's leave-one-out
    predictive density, log sum_s w_is p_is / sum_s w_is with w = exp(log_ratios), and its Monte
    Carlo sd on the log scale (delta method, sqrt(sum_s wn_s^2 (p_s - E)^2) / E with wn the
    normalised weights, divided by sqrt(reff) for the chains' autocorrelation)."""
    log_lik = log_lik.reshape(-1, log_lik.shape[-1])
    log_w = log_ratios.reshape(log_lik.shape)
    log_wn = log_w - logsumexp(log_w, axis=0)
    elpd_i = logsumexp(log_wn + log_lik, axis=0)
    weighted_relative = np.exp(log_wn + log_lik - elpd_i) - np.exp(log_wn)  # wn_s (p_s - E) / E
    mc_sd = np.sqrt(np.sum(weighted_relative**2, axis=0) / reff)
    return elpd_i, mc_sd


@pytest.fixture(scope="module")
def contaminated():
    data, _, _, n_out = regression_data(n=N, p=3, outlier_fraction=0.1, seed=3)
    assert n_out == 8
    return data


@pytest.fixture(scope="module")
def kl_fit(glm_normal_standardized, contaminated):
    return glm_normal_standardized.sample(contaminated, seed=11, **RUN)


@pytest.fixture(scope="module")
def beta_fit(glm_normal_standardized, contaminated):
    return glm_normal_standardized.sample(contaminated, divergence=rs.BetaD(0.3), seed=12, **RUN)


def test_kl_loo_is_arviz_loo(kl_fit):
    """Under KL with w = 1 and weights 1 the generalized ratios are 1 / p(y_i | theta): fit.loo() is
    arviz.loo on the fit's own ArviZ object, to 1e-8, total and pointwise."""
    import arviz as az

    ours, arviz_own = _fields(kl_fit.loo()), _fields(az.loo(kl_fit.to_arviz(), pointwise=True))
    for name in ("elpd", "se", "p"):
        assert abs(ours[name] - arviz_own[name]) < 1e-8, name
    for name in ("elpd_i", "pareto_k"):
        np.testing.assert_allclose(ours[name], arviz_own[name], rtol=0, atol=1e-8, err_msg=name)


def test_beta_loo_matches_exact_leave_one_out_refits(glm_normal_standardized, contaminated, beta_fit):
    """For rows REFIT_ROWS, the beta fit's PSIS elpd_i matches an exact leave-one-out refit (the same
    data with v_i = 0; its elpd_i = log mean_s p(y_i | theta_s)) within 4 combined Monte Carlo sds:
    the refit's (delta method: MCSE of mean_s p over that mean, from ArviZ's ESS) and PSIS's own
    (_importance_sampling_elpd's sd). Importance sampling with the ordinary ratios 1 / p(y_i | theta)
    misses the outlier row by more than that, so the test tells the two formulas apart."""
    import arviz as az

    loo = _fields(beta_fit.loo())
    assert loo["pareto_k"].max() < 0.7
    reff = relative_efficiency(beta_fit.posterior)
    _, psis_sd = _importance_sampling_elpd(beta_fit.log_lik, beta_fit.robust_loss, reff)  # w = 1, v = 1
    ordinary, _ = _importance_sampling_elpd(beta_fit.log_lik, -beta_fit.log_lik, reff)
    for row in REFIT_ROWS:
        weights = np.ones(N)
        weights[row] = 0.0
        refit = glm_normal_standardized.sample(contaminated, divergence=rs.BetaD(0.3), weights=weights,
                                               seed=100 + row, **RUN)
        density = np.exp(refit.log_lik[:, :, row])
        exact = float(np.log(density.mean()))
        exact_sd = float(az.mcse(density, method="mean")) / density.mean()
        tolerance = 4 * np.hypot(exact_sd, psis_sd[row])
        assert abs(loo["elpd_i"][row] - exact) < tolerance, (row, loo["elpd_i"][row], exact, tolerance)
        if row == 0:  # the outlier: the ordinary ratios 1 / p(y_i | theta) fail the same check
            assert abs(ordinary[row] - exact) > tolerance, (ordinary[row], exact, tolerance)


def test_loo_is_the_generalized_ratio_formula_by_numpy(beta_fit):
    """An independent NumPy computation from the draws: self-normalised importance sampling with
    ratios exp(w v_i l_i) (here w = 1, v = 1) agrees with fit.loo()'s PSIS row by row within 4 of its
    Monte Carlo sds (every k-hat is below 0.7, where smoothing changes the estimate by less than its
    error); lppd - elpd is p_loo and sqrt(n var(elpd_i)) the se (the variance as the ArviZ line
    takes it), to 1e-10."""
    loo = _fields(beta_fit.loo())
    assert np.all(loo["pareto_k"] < 0.7)
    elpd_i, sd = _importance_sampling_elpd(beta_fit.log_lik, beta_fit.robust_loss,
                                           relative_efficiency(beta_fit.posterior))
    assert np.all(np.abs(loo["elpd_i"] - elpd_i) < 4 * sd), np.max(np.abs(loo["elpd_i"] - elpd_i) / sd)
    log_lik = beta_fit.log_lik.reshape(-1, N)
    lppd = np.sum(logsumexp(log_lik, axis=0) - np.log(log_lik.shape[0]))
    assert abs(loo["elpd"] - loo["elpd_i"].sum()) < 1e-10
    assert abs(loo["p"] - (lppd - loo["elpd"])) < 1e-10
    ddof = 1 if arviz_major() >= 1 else 0   # the se's variance: arviz_stats divides by n - 1, ArviZ 0.x by n
    assert abs(loo["se"] - np.sqrt(N * np.var(loo["elpd_i"], ddof=ddof))) < 1e-10


def test_learning_rate_and_weights_enter_the_ratios(glm_normal_standardized, contaminated):
    """With w = 0.5 and v = 2 on the first half of the rows, the ratios are w v_i l_i: NumPy's
    importance sampling with exactly those ratios agrees with fit.loo() within 4 Monte Carlo sds,
    and with w v_i = 1 on the first half they are ordinary PSIS-LOO's ratios there."""
    weights = np.where(np.arange(N) < N // 2, 2.0, 1.0)
    fit = glm_normal_standardized.sample(contaminated, learning_rate=0.5, weights=weights, seed=13, **RUN)
    loo = _fields(fit.loo())
    elpd_i, sd = _importance_sampling_elpd(fit.log_lik, 0.5 * weights * fit.robust_loss,
                                           relative_efficiency(fit.posterior))
    assert np.all(np.abs(loo["elpd_i"] - elpd_i) < 4 * sd)
    assert MODEL_LOG_LIKELIHOOD in group_names(fit.to_arviz())   # KL, but w v_i != 1 on half the rows


def test_compare_takes_fit_loo_results(kl_fit, beta_fit):
    """arviz.compare runs on two fit.loo() results and ranks them by elpd."""
    import arviz as az

    kl, beta = kl_fit.loo(), beta_fit.loo()
    table = az.compare({"KL": kl, "beta": beta})
    assert set(table.index) == {"KL", "beta"} and {"rank", "elpd_diff", "weight"} <= set(table.columns)
    best = "KL" if _fields(kl)["elpd"] > _fields(beta)["elpd"] else "beta"
    assert table.index[0] == best and table.loc[best, "elpd_diff"] == 0


def test_to_arviz_keeps_the_model_log_likelihood_out_of_arvizs_loo(kl_fit, beta_fit):
    """KL (w = 1, weights 1): log_likelihood as before. Beta: log p(y_i | theta) in
    model_log_likelihood, with a note, and arviz.loo refuses for want of a log_likelihood group."""
    import arviz as az

    kl_groups = group_names(kl_fit.to_arviz())
    assert "log_likelihood" in kl_groups and MODEL_LOG_LIKELIHOOD not in kl_groups
    idata = beta_fit.to_arviz()
    assert "log_likelihood" not in group_names(idata)
    group = idata[MODEL_LOG_LIKELIHOOD]
    np.testing.assert_array_equal(group["y"].values, beta_fit.log_lik)
    assert "fit.loo()" in group.attrs["note"]
    with pytest.raises((TypeError, KeyError, ValueError)):
        az.loo(idata)


@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")  # one short chain: no R-hat
def test_loo_refuses_what_it_cannot_give(glm_normal_standardized, contaminated):
    """The original gamma form (not a sum over rows) and draws that are not NUTS's are refused, with why."""
    short = dict(chains=1, iter_warmup=200, iter_sampling=100, show_progress=False)
    original = glm_normal_standardized.sample(contaminated, divergence=rs.GammaD(0.3, form="original"),
                                              seed=1, **short)
    with pytest.raises(rs.RobustStanInputError, match="not a sum over observations"):
        original.loo()
    approximate = glm_normal_standardized.variational(contaminated, divergence=rs.BetaD(0.3), draws=100, seed=1,
                                                      show_progress=False)
    with pytest.raises(rs.RobustStanInputError, match="NUTS"):
        approximate.loo()


def test_program_fits_give_the_same_loo():
    """Your own programs: as written (rs.from_stan, its own log_lik) and robustified under KL,
    fit.loo() is arviz.loo on to_arviz() to 1e-8; robustified under beta, the generalized ratios
    (NumPy importance sampling within 4 Monte Carlo sds) and log_likelihood left to model_log_likelihood."""
    import arviz as az

    data = _linear_regression(np.random.default_rng(7))
    data["y"][:4] += 15.0
    options = dict(chains=4, iter_warmup=500, iter_sampling=1000, seed=3, show_progress=False)
    plain = rs.from_stan(_program("linear_regression"), engine=ENGINE).sample(data, **options)
    robust = rs.robustify(_program("linear_regression"), engine=ENGINE)
    for fit in (plain, robust.sample(data, **options)):
        ours, arviz_own = _fields(fit.loo()), _fields(az.loo(fit.to_arviz(), pointwise=True))
        assert abs(ours["elpd"] - arviz_own["elpd"]) < 1e-8
        np.testing.assert_allclose(ours["elpd_i"], arviz_own["elpd_i"], rtol=0, atol=1e-8)
    beta = robust.sample(data, divergence=rs.BetaD(0.3), **options)
    loo = _fields(beta.loo())
    elpd_i, sd = _importance_sampling_elpd(beta.log_lik, beta.robust_loss,
                                           relative_efficiency(beta.posterior))
    assert np.all(np.abs(loo["elpd_i"] - elpd_i) < 4 * sd)
    assert MODEL_LOG_LIKELIHOOD in group_names(beta.to_arviz())
    with pytest.raises(rs.RobustStanInputError, match="outcome"):
        beta.loo(outcome="z")
