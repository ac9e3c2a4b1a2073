"""Bad input (DESIGN.md section 4): a clear error naming the argument, before any compile
or sampling. The models here are never compiled: each test checks that the failing
call left its model without a compiled program."""

import numpy as np
import pytest

import robust_stan as rs

from .conftest import ENGINE

SHORT = dict(chains=1, iter_warmup=10, iter_sampling=10, show_progress=False)


def good_regression(n=20, p=2):
    rng = np.random.default_rng(0)
    return {"X": rng.normal(size=(n, p)), "y": rng.normal(size=n)}


def fails_before_compiling(model, data, match, **kwargs):
    with pytest.raises(rs.RobustStanInputError, match=match):
        model.sample(data, **SHORT, **kwargs)
    assert model._program is None, "the error came after compiling"


@pytest.fixture
def normal_glm():
    return rs.glm("normal", engine=ENGINE)


# -- non-finite data and shape mismatches --------------------------------------------

@pytest.mark.parametrize("column,row,value", [("y", 3, np.nan), ("y", 0, np.inf), ("X", 5, -np.inf)])
def test_non_finite_data(normal_glm, column, row, value):
    data = good_regression()
    data[column] = data[column].copy()
    data[column][row] = value
    fails_before_compiling(normal_glm, data, rf"^{column}: .*non-finite")


def test_predictor_rows_must_match_outcomes(normal_glm):
    data = good_regression()
    data["X"] = data["X"][:-1]
    fails_before_compiling(normal_glm, data, r"^X: .*one row per observation \(20\)")


def test_missing_outcome_and_declared_data(normal_glm):
    fails_before_compiling(normal_glm, {"X": np.ones((3, 1))}, r"^data: missing the outcome 'y'")
    model = rs.location("normal", known={"sigma": 1.0}, engine=ENGINE)
    fails_before_compiling(model, {"y": np.zeros(4), "sigma": 2.0}, r"^data: 'sigma' is fixed by the model's known=")
    custom = rs.custom("normal", data="real<lower=0> s;", parameters="real mu;", priors="mu ~ normal(0, 1);",
                       mu="mu", sigma="s", engine=ENGINE)
    fails_before_compiling(custom, {"y": np.zeros(4)}, r"^data: missing 's'")


@pytest.mark.parametrize("known, expected", [
    ({"sigma": "abc"}, r"^known: sigma must be a positive number, got 'abc'"),
    ({"sigma": -1.0}, r"^known: sigma must be a positive number, got -1.0"),
    ({"sigma": float("nan")}, r"^known: sigma must be a positive number"),
    ({"nu": 0.5}, r"^known: nu must be a number >= 1 \(the model declares nu >= 1\), got 0.5"),
    ({"sigma": True}, r"^known: sigma must be a positive number, got True"),
    ([("sigma", 1.0)], r"^known: expected a dict"),
])
def test_known_values_are_checked_when_the_model_is_built(known, expected):
    with pytest.raises(rs.RobustStanInputError, match=expected):
        rs.location("student_t", known=known, engine=ENGINE)


def test_multi_normal_outcome_must_be_a_matrix():
    fails_before_compiling(rs.location("multi_normal", engine=ENGINE), {"y": np.zeros(5)}, r"^y: .*\(N, D\)")


def test_data_must_be_a_mapping(normal_glm):
    fails_before_compiling(normal_glm, [1, 2, 3], r"^data: expected a dict")


def test_no_observations(normal_glm):
    """N = 0 used to sample the prior without a word."""
    fails_before_compiling(normal_glm, {"X": np.ones((0, 2)), "y": np.zeros(0)}, r"^y: no observations \(N = 0\)")


def test_glm_without_predictors_names_X(normal_glm):
    """It used to say "missing 'P'" (P is computed from X)."""
    fails_before_compiling(normal_glm, {"y": np.zeros(5)}, r"^data: missing the predictor matrix 'X'")


@pytest.mark.parametrize("y", [np.array([3e9, 1.0, 2.0]), np.array([3_000_000_000, 1, 2])])
def test_counts_past_stans_int(y):
    """Counts beyond Stan's 32-bit int used to fail as "Unable to cast Python instance to C++ type"."""
    fails_before_compiling(rs.location("poisson", engine=ENGINE), {"y": y}, r"^y: Stan's integers hold at most 2147483647")


def test_categorical_with_one_class_present_asks_for_K():
    """K is inferred from max(y); with one class present the message used to be "K: needs at least 2"."""
    fails_before_compiling(rs.location("categorical", engine=ENGINE), {"y": np.ones(6)},
                           r"^y: every row is class 1; .*give data\['K'\]")


@pytest.mark.parametrize("inits", [{"mu": float("nan")}, {"mu": "abc"}, {"sigma": [np.inf]}])
def test_inits_must_be_finite(inits):
    """inits={'alpha': nan} used to reach the user as a raw Stan exception."""
    fails_before_compiling(rs.location("normal", engine=ENGINE), {"y": np.arange(5.0)}, r"^inits: (mu|sigma) must be finite",
                           inits=inits)


# -- labels outside the family's support ----------------------------------------------

@pytest.mark.parametrize("family,extra,y,match", [
    ("poisson", {}, [0, 3, -1, 2], r"^y: counts must be >= 0 \(row 2 is -1\)"),
    ("bernoulli", {}, [0, 1, 2, 1], r"^y: bernoulli outcomes must be 0 or 1 \(row 2 is 2\)"),
    ("bernoulli", {}, [0, 1, 0.5, 1], r"^y: must hold whole numbers"),
    ("binomial", {"trials": [3, 3, 3, 3]}, [0, 4, 1, 2], r"^y: row 1 has more successes than trials"),
    ("binomial", {}, [0, 1, 1, 2], r"^trials: the binomial family needs"),
    ("categorical", {"K": 3}, [1, 2, 4, 3], r"^y: classes must be in 1..K=3 \(row 2 is 4\)"),
    ("categorical", {"K": 3}, [0, 2, 1, 3], r"^y: classes must be in 1..K=3 \(row 0 is 0\)"),
    ("exponential", {}, [0.5, -0.1, 2.0, 1.0], r"^y: exponential outcomes must be >= 0"),
])
def test_labels_outside_the_support(family, extra, y, match):
    data = {"X": np.linspace(-1, 1, 4)[:, None], "y": np.array(y), **extra}
    fails_before_compiling(rs.glm(family, engine=ENGINE), data, match)


# -- divergence parameters, learning rate and weights ------------------------------------

@pytest.mark.parametrize("make,name", [
    (lambda: rs.BetaD(0), "beta"), (lambda: rs.BetaD(-0.2), "beta"), (lambda: rs.BetaD(float("nan")), "beta"),
    (lambda: rs.BetaD(True), "beta"), (lambda: rs.GammaD(np.True_), "gamma"),
    (lambda: rs.GammaD(0.0), "gamma"), (lambda: rs.GammaD(-1), "gamma"), (lambda: rs.GammaD("big"), "gamma"),
])
def test_divergence_parameter_must_be_positive(make, name):
    with pytest.raises(rs.RobustStanInputError, match=rf"^{name}: must be (a )?positive"):
        make()


def test_unknown_gamma_form_and_divergence_object(normal_glm):
    with pytest.raises(rs.RobustStanInputError, match=r"^form: "):
        rs.GammaD(0.3, form="other")
    fails_before_compiling(normal_glm, good_regression(), r"^divergence: expected rs.KL\(\)", divergence=0.3)


@pytest.mark.parametrize("learning_rate", [0, -1.0, float("inf")])
def test_learning_rate_must_be_positive(normal_glm, learning_rate):
    fails_before_compiling(normal_glm, good_regression(), r"^learning_rate: must be positive",
                           learning_rate=learning_rate)


@pytest.mark.parametrize("weights,match", [
    (np.r_[np.ones(19), -1.0], r"^weights: must be >= 0; entry 19 is negative"),
    (np.ones(19), r"^weights: need one weight per observation, shape \(20,\)"),
    (np.ones((20, 2)), r"^weights: need one weight per observation"),
    (np.r_[np.ones(19), np.nan], r"^weights: contains non-finite"),
    (np.zeros(20), r"^weights: at least one weight must be positive"),
    (["a"] * 20, r"^weights: must be numbers, one per observation"),
])
def test_bad_weights(normal_glm, weights, match):
    fails_before_compiling(normal_glm, good_regression(), match, weights=weights)


def test_bad_sampler_settings(normal_glm):
    with pytest.raises(rs.RobustStanInputError, match=r"^chains: must be an integer >= 1"):
        normal_glm.sample(good_regression(), chains=0, show_progress=False)
    with pytest.raises(rs.RobustStanInputError, match=r"^adapt_delta: "):
        normal_glm.sample(good_regression(), adapt_delta=1.5, show_progress=False)
    assert normal_glm._program is None


# -- unknown families, links, engines ----------------------------------------------------

def test_unknown_family_and_link():
    with pytest.raises(rs.RobustStanInputError, match=r"^family: unknown family 'gaussian'; choose one of"):
        rs.glm("gaussian")
    with pytest.raises(rs.RobustStanInputError, match=r"^link: the poisson family supports \['log'\], not 'identity'"):
        rs.glm("poisson", link="identity")
    with pytest.raises(rs.RobustStanInputError, match=r"^family: unknown family"):
        rs.location("gumbel")
    with pytest.raises(rs.RobustStanInputError, match=r"^family: rs.location does not offer the 'weibull' family"):
        rs.location("weibull")
    with pytest.raises(rs.RobustStanInputError, match=r"^engine: unknown engine 'stan'"):
        rs.glm("normal", engine="stan")


def test_unknown_prior_name():
    with pytest.raises(rs.RobustStanInputError, match=r"^priors: unknown parameter\(s\) \['beta'\]"):
        rs.glm("normal", priors={"beta": "normal(0, 1)"})


# -- custom specifications that do not compile -----------------------------------------------

HIERARCHICAL = dict(
    data="int<lower=1> P; matrix[N, P] X;",
    parameters="vector[P] b; real<lower=0> sigma;",
    priors="b ~ normal(0, 5);\nsigma ~ exponential(1);",
    mu="X[n] * b",
    sigma="sigma",
)


@pytest.mark.parametrize("change,where", [
    ({"priors": "b ~ normal(0, 5);\nsigma ~ exponentail(1);"}, r"priors line 2: 'sigma ~ exponentail\(1\)'"),
    ({"parameters": "vector[P] b;\nreal<lower=0> sigma;\nvector[Q] u;"}, r"parameters line 3: 'vector\[Q\] u'"),
    ({"data": "int<lower=1> P;\n// predictors\nmatrix[N, P] X; matrix[N, P] X;"}, r"data line 3: 'matrix\[N, P\] X'"),
    ({"mu": "X[n] * c"}, r"the expression for 'mu': 'X\[n\] \* c'"),
])
def test_custom_specification_that_does_not_compile(change, where):
    with pytest.raises(rs.StanCompileError, match=where) as info:
        rs.custom("normal", engine=ENGINE, **dict(HIERARCHICAL, **change))
    assert "stanc said" in str(info.value)


def test_custom_parameter_declaration_that_cannot_be_read():
    with pytest.raises(rs.RobustStanInputError, match=r"^parameters: cannot read the declaration 'real<lower=0 tau'"):
        rs.custom("normal", engine=ENGINE, **dict(HIERARCHICAL, parameters="vector[P] b; real<lower=0 tau;"))


def test_custom_specification_needs_parameters():
    with pytest.raises(rs.RobustStanInputError, match=r"^parameters: "):
        rs.custom("normal", data="", parameters="  ", mu="0", sigma="1")


# -- a divergence that leaves the data no influence --------------------------------------

@pytest.mark.parametrize("beta", [20.0, 1e3, 1e6])
def test_huge_beta_warns_that_the_data_barely_count(normal_glm, beta):
    """A large beta used to run silently and return the prior with clean diagnostics."""
    data = good_regression(n=200)
    with pytest.warns(rs.RobustStanWarning, match=r"^divergence: with beta = .* almost no influence"):
        normal_glm.stan_data(data, rs.BetaD(beta))
    assert normal_glm._program is None


def test_usual_beta_does_not_warn(normal_glm):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", rs.RobustStanWarning)
        normal_glm.stan_data(good_regression(n=200), rs.BetaD(0.5))


def test_beta_loss_effective_sample_size_of_a_normal_sample():
    """For N(0, 1) data and the pilot normal(m, s) (median, 1.4826 x MAD), sum_i p_i^beta / N
    tends to E[p(Z)^beta] = (2 pi s^2)^(-beta/2) (1 + beta/s^2)^(-1/2) exp(-beta m^2 / (2 (s^2 + beta)));
    at N = 20000 it must lie within 3 standard errors of the mean of the terms."""
    from robust_stan.building.data import beta_loss_effective_sample_size, robust_scale
    from robust_stan.building.families import get_family

    z = np.random.default_rng(1).normal(size=20000)
    m, s = np.median(z), robust_scale(z)
    for beta in (0.5, 2.0, 5.0):
        ess = beta_loss_effective_sample_size(get_family("normal"), z, beta, np.ones(z.size))
        exact = z.size * (2 * np.pi * s**2) ** (-beta / 2) / np.sqrt(1 + beta / s**2) * np.exp(
            -beta * m**2 / (2 * (s**2 + beta)))
        terms = np.exp(beta * (-np.log(s) - 0.5 * np.log(2 * np.pi) - 0.5 * ((z - m) / s) ** 2))
        assert abs(ess - exact) < 3 * np.sqrt(z.size) * terms.std(), (beta, ess, exact)
