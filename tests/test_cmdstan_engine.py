"""The CmdStan engine's fits as complete as httpstan's: per-observation quantities for every
method's draws (NUTS, ADVI, Pathfinder, Laplace, draws made in Python), one RNG stream per
(seed, chain), 18 significant digits, ``init`` for Stan's methods, ADVI that stops at its
iteration limit, and your own programs through Stan's methods. Tests that run CmdStan skip
where it is not installed; the refusals run everywhere."""

import warnings

import numpy as np
import pytest

import robust_stan as rs
from robust_stan.building.data import with_switches
from robust_stan.engines.base import parameter_columns
from robust_stan.engines.cmdstan_engine import cmdstan_available

needs_cmdstan = pytest.mark.skipif(not cmdstan_available(), reason="CmdStan is not installed (cmdstanpy."
                                   "cmdstan_path() finds none); install it with python -m cmdstanpy.install_cmdstan")
STAN_METHODS = ["advi", "pathfinder", "laplace"]

PROGRAM = """
data { int<lower=0> N; vector[N] x; vector[N] y; }
parameters { real alpha; real beta; real<lower=0> sigma; }
model {
  alpha ~ normal(0, 5); beta ~ normal(0, 5); sigma ~ normal(0, 2);
  y ~ normal(alpha + beta * x, sigma);
}
"""


def glm_data(n=30, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = 1.0 + X @ np.array([1.0, -0.5]) + rng.normal(size=n)
    y[:2] += 10
    return {"X": X, "y": y}


def program_data(n=30, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return {"N": n, "x": x, "y": 1.0 + 0.5 * x + rng.normal(size=n)}


def normal_log_density(fit, data):
    """log N(y_i | alpha + X_i b, sigma) at every draw of a glm fit, (chains, draws, N)."""
    mu = fit.draws("alpha")[..., None] + np.einsum("cdp,np->cdn", fit.draws("b"), data["X"])
    sigma = fit.draws("sigma")[..., None]
    return -0.5 * np.log(2 * np.pi) - np.log(sigma) - 0.5 * ((data["y"] - mu) / sigma) ** 2


@pytest.fixture(scope="module")
def glm():
    model = rs.glm("normal", standardize=False, engine="cmdstan")
    model.compile(show_progress=False)
    return model


@pytest.fixture(scope="module")
def nuts_fit(glm):
    with warnings.catch_warnings():  # short chains: convergence is not what these tests check
        warnings.simplefilter("ignore", rs.RobustStanWarning)
        return glm.sample(glm_data(), divergence=rs.BetaD(0.3), chains=2, iter_warmup=300, iter_sampling=300,
                          seed=4, show_progress=False)


# -- per-observation quantities of every method's draws ---------------------------------------
@pytest.mark.stan
@needs_cmdstan
@pytest.mark.parametrize("method", STAN_METHODS)
def test_stan_methods_fits_give_log_lik_y_rep_arviz_and_outlier_scores(glm, method):
    data = glm_data()
    fit = glm.variational(data, divergence=rs.BetaD(0.3), method=method, draws=200, seed=2, show_progress=False,
                          **({"require_converged": False} if method == "advi" else {}))
    assert fit.log_lik.shape == (1, 200, 30)
    np.testing.assert_allclose(fit.log_lik, normal_log_density(fit, data), rtol=1e-12, atol=1e-12)
    assert fit.y_rep.shape == (1, 200, 30) and np.all(np.isfinite(fit.y_rep))
    assert fit.robust_loss.shape == (1, 200, 30)
    assert fit.outlier_scores().shape == (30,)
    assert {"posterior", "posterior_predictive", "observed_data"} <= set(fit.to_arviz().groups())


@pytest.mark.stan
@needs_cmdstan
def test_draws_made_in_python_get_generated_quantities_without_bridgestan(glm, nuts_fit):
    """Any constrained draws (as Rob-ULA's): a draw with a non-finite parameter gives NaN and
    leaves the other draws' values and random numbers as they were."""
    program = glm.compile()
    data = with_switches(nuts_fit.stan_data, pointwise=True)
    parameters = parameter_columns(nuts_fit.raw.variables, [f"{p.name}_copies" for p in glm.spec.parameters])[:, :20]
    whole = program.generated_quantities(data, parameters, 7)
    holed = parameters.copy()
    holed[1, 5:] = np.nan  # chain 1 from draw 5 on
    holed[0, :] = np.nan  # chain 0 entirely
    partial = program.generated_quantities(data, holed, 7)
    assert np.all(np.isnan(partial["log_lik"][0])) and np.all(np.isnan(partial["log_lik"][1, 5:]))
    np.testing.assert_array_equal(partial["y_rep"][1, :5], whole["y_rep"][1, :5])


# -- random numbers: one stream per (seed, chain) ----------------------------------------------
@pytest.mark.stan
@needs_cmdstan
def test_y_rep_noise_differs_between_chains(nuts_fit):
    """The same seed in every chain's generated quantities would make y_rep - E[y_rep] identical
    across chains at equal parameters; with one stream per chain the noise is uncorrelated."""
    y_rep = nuts_fit.y_rep
    mu = nuts_fit.draws("alpha")[..., None] + np.einsum("cdp,np->cdn", nuts_fit.draws("b"), glm_data()["X"])
    noise = (y_rep - mu) / nuts_fit.draws("sigma")[..., None]
    correlation = np.corrcoef(noise[0].ravel(), noise[1].ravel())[0, 1]
    assert abs(correlation) < 0.1  # 9,000 pairs: sd of the correlation about 0.01
    again = type(nuts_fit)(nuts_fit.model, nuts_fit.raw, nuts_fit.model.prepare(glm_data(), nuts_fit.divergence),
                           nuts_fit.settings).y_rep
    np.testing.assert_array_equal(y_rep, again)  # seeded: the same on a second fit object


@pytest.mark.stan
@needs_cmdstan
def test_y_rep_streams_are_httpstans(nuts_fit):
    """CmdStan's generate_quantities with num_chains and httpstan's native call both draw chain
    c's random numbers from Stan's RNG for (seed, c + 1): the same draws give the same y_rep."""
    pytest.importorskip("httpstan")
    other = rs.glm("normal", standardize=False, engine="httpstan")
    assert other.stan_code == nuts_fit.model.stan_code
    parameters = parameter_columns(nuts_fit.raw.variables, [f"{p.name}_copies" for p in other.spec.parameters])
    via_cmdstan = nuts_fit.generated_quantities_at()
    via_httpstan = other.compile(show_progress=False).generated_quantities(
        with_switches(nuts_fit.stan_data, pointwise=True), parameters, nuts_fit.settings.seed)
    np.testing.assert_allclose(via_cmdstan["y_rep"], via_httpstan["y_rep"], rtol=1e-12)


# -- digits --------------------------------------------------------------------------------------
@pytest.mark.stan
@needs_cmdstan
def test_draws_keep_more_than_six_significant_digits(nuts_fit):
    draws = nuts_fit.draws("sigma").ravel()
    six_digits = np.array([float(f"{v:.6g}") for v in draws])
    assert np.mean(draws != six_digits) > 0.9


# -- inits= for Stan's methods ------------------------------------------------------------------
@pytest.mark.stan
@needs_cmdstan
@pytest.mark.parametrize("method", STAN_METHODS)
def test_init_starts_stan_methods(glm, method):
    fit = glm.variational(glm_data(), method=method, draws=100, seed=3, show_progress=False,
                          inits={"alpha": 1.0, "b": [1.0, -0.5], "sigma": 1.5},
                          **({"require_converged": False} if method == "advi" else {}))
    backend = fit.raw.backend
    if method == "laplace":
        backend = backend.mode  # Laplace's optimizer starts there
    runset = backend.runset if hasattr(backend, "runset") else backend._runset  # CmdStanPathfinder keeps it private
    assert any(part.startswith("init=") for part in runset.cmd(0))
    assert fit.draws("b").shape == (1, 100, 2)


@pytest.mark.stan
@needs_cmdstan
def test_laplace_refuses_init_beside_a_mode(glm):
    with pytest.raises(rs.RobustStanInputError, match="^inits: "):
        glm.variational(glm_data(), method="laplace", inits={"alpha": 1.0}, stan_options={"mode": "somewhere.csv"},
                        show_progress=False)


@pytest.mark.stan
@needs_cmdstan
def test_unknown_init_names_are_refused(glm):
    with pytest.raises(rs.RobustStanInputError, match="^inits: unknown parameter"):
        glm.variational(glm_data(), method="pathfinder", inits={"gamma": 1.0}, show_progress=False)


# -- ADVI that stops at its iteration limit ------------------------------------------------------
@pytest.mark.stan
@needs_cmdstan
def test_advi_stopped_at_its_iteration_limit_warns(glm):
    options = dict(method="advi", family="fullrank", iter=40, eval_elbo=20, tol_rel_obj=1e-9, draws=50, seed=1,
                   show_progress=False)
    with pytest.warns(rs.RobustStanWarning, match="iteration limit"):
        fit = glm.variational(glm_data(), **options)
    assert fit.draws("b").shape == (1, 50, 2)
    with pytest.raises(RuntimeError, match="may not have converged"):
        glm.variational(glm_data(), stan_options={"require_converged": True}, **options)


@pytest.mark.stan
@needs_cmdstan
def test_advi_that_converges_does_not_warn(glm):
    with warnings.catch_warnings():
        warnings.simplefilter("error", rs.RobustStanWarning)
        glm.variational(glm_data(), method="advi", iter=10000, tol_rel_obj=0.05, draws=50, seed=1,
                        show_progress=False)


# -- your own programs through Stan's methods -------------------------------------------------
@pytest.mark.stan
@needs_cmdstan
@pytest.mark.parametrize("method", STAN_METHODS)
def test_own_program_runs_stans_methods(method):
    model = rs.robustify(PROGRAM, engine="cmdstan")
    data = program_data()
    fit = model.variational(data, divergence=rs.BetaD(0.3), method=method, draws=200, seed=5, show_progress=False,
                            inits={"alpha": 0.5, "beta": 0.5, "sigma": 1.0},
                            **({"require_converged": False} if method == "advi" else {}))
    assert fit.method == method and fit.draws("beta").shape == (1, 200)
    log_lik = fit.log_lik
    mu = fit.draws("alpha")[..., None] + fit.draws("beta")[..., None] * data["x"]
    sigma = fit.draws("sigma")[..., None]
    expected = -0.5 * np.log(2 * np.pi) - np.log(sigma) - 0.5 * ((data["y"] - mu) / sigma) ** 2
    np.testing.assert_allclose(log_lik, expected, rtol=1e-12, atol=1e-12)
    if method != "advi":  # CmdStan's ADVI stops early by default; the others find the posterior's centre
        slope = np.polyfit(data["x"], data["y"], 1)[0]
        assert abs(float(fit.draws("beta").mean()) - slope) < 0.2


@pytest.mark.parametrize("method", STAN_METHODS)
def test_own_program_on_httpstan_refuses_stans_methods_by_name(method):
    pytest.importorskip("httpstan")
    model = rs.robustify(PROGRAM, engine="httpstan")
    with pytest.raises(rs.RobustStanInputError, match=rf"^method: '{method}' is Stan's own algorithm"):
        model.variational(program_data(), method=method, show_progress=False)
