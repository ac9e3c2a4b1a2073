"""Models built from a formula (``rs.glm(family, formula=...)``) and named coefficients, without
compiling: the generated programs (stanc checks them; a formula without group-level terms is the
X-built glm's program), the data prepared from a data frame, names in summary() and the posterior's
coords, and fit.predict against NumPy at synthetic draws. The compiled checks are in
tests/test_formula_fits.py."""

import numpy as np
import pandas as pd
import pytest

import robust_stan as rs
from robust_stan.building.formulas import design_stan_data, formula_design, parse_formula
from robust_stan.building.stanc import check_program
from robust_stan.common.errors import RobustStanInputError
from robust_stan.engines import RawDraws
from robust_stan.methods.nuts import nuts_settings
from robust_stan.results.fits.mcmc import Fit

GROUPED = "y ~ x1 + C(f) + (1 + x1 | g) + (1 || h)"


@pytest.fixture
def frame():
    rng = np.random.default_rng(5601)
    n = 60
    return pd.DataFrame({
        "y": rng.normal(size=n),
        "x1": rng.normal(size=n),
        "x2": rng.uniform(1.0, 2.0, size=n),
        "f": rng.choice(["a", "b", "c"], size=n),
        "g": rng.choice(["p", "q", "r", "s"], size=n),
        "h": rng.choice([1, 2, 3], size=n),
        "k": rng.integers(0, 2, size=n),
        "n": rng.integers(1, 6, size=n),
    }, index=pd.Index(np.arange(200, 200 + n), name="id"))


# -- the programs ------------------------------------------------------------------------------

def test_formula_without_group_terms_is_the_x_glm_program():
    """The same program text, so the same compiled binary (the cache is keyed by the text)."""
    for family in ("normal", "bernoulli", "poisson", "exponential", "categorical"):
        assert rs.glm(family, formula="y ~ x1 + C(g)").stan_code == rs.glm(family).stan_code
    assert rs.glm("bernoulli", formula="k ~ x", mislabel=True).stan_code == rs.glm("bernoulli", mislabel=True).stan_code
    assert rs.glm("binomial", formula="y | trials(n) ~ x").stan_code == rs.glm("binomial").stan_code


def test_program_depends_on_the_terms_not_the_columns():
    one = rs.glm("normal", formula="y ~ x1 + (1 | g)")
    assert one.stan_code == rs.glm("normal", formula="score ~ x1 + x2 + C(f) + (1 + x1 | g)").stan_code
    assert one.stan_code != rs.glm("normal", formula="y ~ x1 + (1 || g)").stan_code  # no Cholesky factor
    assert one.stan_code != rs.glm("normal", formula="y ~ x1 + (1 | school)").stan_code  # the names differ


@pytest.mark.parametrize("family", ["normal", "student_t", "bernoulli", "binomial", "poisson", "exponential"])
@pytest.mark.parametrize("formula", [GROUPED, "y ~ 0 + x1 + (x1 || g)", "y ~ 1 + (1 | g1:g2)"])
def test_stanc_accepts_the_generated_programs(family, formula):
    if family == "binomial":
        formula = formula.replace("y ~", "y | trials(n) ~")
    model = rs.glm(family, formula=formula)
    check_program(model.stan_code, model.spec)


def test_group_term_parameters_priors_and_modes():
    model = rs.glm("normal", formula=GROUPED)
    spec = model.spec
    assert spec.parameter_names == ["alpha", "b", "z_g", "sd_g", "L_g", "z_h", "sd_h", "sigma"]
    assert spec.linear_predictor is None  # mode 3 covers b only: per-example gradients by copies
    assert spec.rescale == {"alpha": "location", "b": "scale", "sigma": "scale", "sd_g": "scale", "sd_h": "scale"}
    assert "to_vector(z_g) ~ std_normal();" in spec.priors and "L_g ~ lkj_corr_cholesky(2);" in spec.priors
    replaced = rs.glm("normal", formula=GROUPED, priors={"sd_g": "normal(0, 1)", "L_g": "lkj_corr_cholesky(4)"})
    assert "sd_g ~ normal(0, 1);" in replaced.spec.priors and "L_g ~ lkj_corr_cholesky(4);" in replaced.spec.priors
    with pytest.raises(RobustStanInputError, match=r"priors: \['z_g'\] are the standard-normal"):
        rs.glm("normal", formula=GROUPED, priors={"z_g": "normal(0, 2)"})
    with pytest.raises(RobustStanInputError, match=r"priors: unknown parameter\(s\) \['L_h'\]"):
        rs.glm("normal", formula=GROUPED, priors={"L_h": "lkj_corr_cholesky(2)"})  # independent: no L_h
    # a log link: the outcome's scale moves the intercept only, so sd_g stays as fitted
    assert rs.glm("exponential", formula=GROUPED).spec.rescale == {"alpha": "log_scale"}
    assert rs.glm("poisson", formula="y ~ x").spec.linear_predictor is not None  # no group terms: mode 3 stays


def test_no_intercept():
    spec = rs.glm("normal", formula="y ~ 0 + x1 + (x1 || g)").spec
    assert "alpha" not in spec.parameter_names and "alpha" not in spec.args["mu"].per_observation
    assert spec.standardize == "spread" and "alpha" not in spec.rescale  # divided by its spread, not centred
    assert rs.glm("exponential", formula="y ~ x1 - 1").spec.standardize is None
    assert rs.glm("normal", formula="y ~ x1").spec.standardize == "affine"


@pytest.mark.parametrize(("family", "formula", "message"), [
    ("categorical", "y ~ x + (1 | g)", "group-level terms .* not offered for the categorical family"),
    ("multi_normal", "y ~ x + (1 | g)", r"outcome is a matrix \(N, D\)"),
    ("categorical", "y ~ 0 + x", "without one .* not offered"),
    ("binomial", "y ~ x", r"needs its numbers of trials: write 'y \| trials\(n\) ~ ...'"),
    ("poisson", "y | trials(n) ~ x", r"'\| trials\(n\)' is for a binomial outcome, not poisson"),
    ("normal", "y | weights(w) ~ x", r"can only be followed by '\| trials\(n\)'"),
    ("normal", "~ x", "has no outcome"),
    ("multi_normal", "y ~ x", r"outcome is a matrix \(N, D\)"),
])
def test_formula_refusals_name_the_argument(family, formula, message):
    with pytest.raises(RobustStanInputError, match="^formula: .*" + message):
        rs.glm(family, formula=formula)


def test_a_formula_given_as_the_family_is_pointed_to_formula():
    with pytest.raises(RobustStanInputError, match=r"family: got the formula 'y ~ x'; write rs.glm\(family, formula="):
        rs.glm("y ~ x")


def test_influence_refuses_a_formula_model(frame):
    with pytest.raises(RobustStanInputError, match="fit_or_model: rs.influence .* not offered for a model built from"):
        rs.influence(rs.glm("normal", formula="y ~ x1"), frame, 0, [0.0], frame)


def test_trials_in_the_formula():
    parsed = parse_formula("successes | trials(`n tries`) ~ x + (1 | g)")
    assert (parsed.outcome, parsed.trials, parsed.fixed) == ("successes", "n tries", "x")


# -- the data ----------------------------------------------------------------------------------

def test_prepared_data_are_the_design_stan_data(frame):
    model = rs.glm("normal", formula=GROUPED, standardize=False)
    prepared = model.prepare(frame)
    design = formula_design(GROUPED, frame)
    for name, value in design_stan_data(design).items():
        np.testing.assert_array_equal(prepared.stan_data[name], value, err_msg=name)
    assert prepared.stan_data["P"] == 3 and prepared.stan_data["N"] == len(frame)
    np.testing.assert_allclose(prepared.stan_data["prior_scale_b"], 2.5 / design.X.std(axis=0), rtol=1e-14)
    assert prepared.column_names == ("x1", "C(f)[T.b]", "C(f)[T.c]")
    assert prepared.design.groups[0].levels == ("p", "q", "r", "s")
    # the same data as the X-built program would take, by name
    assert set(prepared.stan_data) >= {"J_g", "Z_g", "G_g", "K_g", "J_h", "Z_h", "G_h", "K_h"}


def test_binomial_trials_from_the_frame(frame):
    frame = frame.assign(successes=np.minimum(frame["n"], 2))
    prepared = rs.glm("binomial", formula="successes | trials(n) ~ x1 + (1 | g)").prepare(frame)
    np.testing.assert_array_equal(prepared.stan_data["trials"], frame["n"].to_numpy())
    np.testing.assert_array_equal(prepared.stan_data["y"], frame["successes"].to_numpy())
    with pytest.raises(RobustStanInputError, match=r"data: missing values .* \['n'\] at rows 201"):
        rs.glm("binomial", formula="successes | trials(n) ~ x1").prepare(frame.assign(n=frame["n"].where(
            frame.index != 201)))


def test_formula_data_refusals(frame):
    model = rs.glm("bernoulli", formula="k ~ x1 + (1 | g)")
    with pytest.raises(RobustStanInputError, match=r"data: missing values .* \['x1'\] at rows 203 \(index labels\)"):
        model.prepare(frame.assign(x1=frame["x1"].where(frame.index != 203)))
    with pytest.raises(RobustStanInputError, match=r"reads the column\(s\) \['g'\]"):
        model.prepare(frame.drop(columns="g"))
    with pytest.raises(RobustStanInputError, match="y: "):
        rs.glm("bernoulli", formula="y ~ x1").prepare(frame)  # a continuous outcome is no label


def test_partitioned_rows_refused_with_a_formula(frame):
    from robust_stan.methods.partition_placement import prepare_partitioned

    model = rs.glm("normal", formula="y ~ x1", standardize=False)
    with pytest.raises(RobustStanInputError, match="data: a model built from a formula"):
        prepare_partitioned(model, {"X": np.zeros((2, 1)), "y": np.zeros(2)}, rs.KL(), 1.0)


def test_no_intercept_standardises_by_the_spread_only(frame):
    prepared = rs.glm("normal", formula="y ~ 0 + x1").prepare(frame)
    assert prepared.scaling.center == 0.0
    y = frame["y"].to_numpy()
    assert prepared.scaling.scale == pytest.approx(1.4826 * np.median(np.abs(y - np.median(y))), rel=1e-14)
    assert "alpha" not in prepared.stan_data


# -- names and predictions at synthetic draws ---------------------------------------------------

def cholesky_factors(rng, shape, K):
    """Cholesky factors of random correlation matrices, (*shape, K, K)."""
    A = rng.normal(size=(*shape, K, K + 2))
    S = A @ np.swapaxes(A, -1, -2)
    d = np.sqrt(np.einsum("...ii->...i", S))
    return np.linalg.cholesky(S / d[..., :, None] / d[..., None, :])


def synthetic_fit(model, data, variables, seed=1):
    """A Fit on given draws of the program's parameters, without running Stan."""
    prepared = model.prepare(data)
    chains, draws = next(iter(variables.values())).shape[:2]
    fit = Fit(model, RawDraws(variables, {"lp__": np.zeros((chains, draws))}), prepared,
              nuts_settings(chains, 10, draws, 1, seed, 0.8, 10, False))
    fit.rows_here = False  # to_arviz without the per-observation quantities (which would run Stan)
    return fit


@pytest.fixture
def grouped_fit(frame):
    rng = np.random.default_rng(56)
    shape = (2, 30)
    variables = {"alpha": rng.normal(size=shape), "b": rng.normal(size=(*shape, 3)),
                 "z_g": rng.normal(size=(*shape, 2, 4)), "sd_g": rng.exponential(size=(*shape, 2)),
                 "L_g": cholesky_factors(rng, shape, 2), "z_h": rng.normal(size=(*shape, 1, 3)),
                 "sd_h": rng.exponential(size=(*shape, 1)), "sigma": rng.exponential(size=shape)}
    return synthetic_fit(rs.glm("normal", formula=GROUPED), frame, variables)


def test_effects_and_correlations_on_the_outcome_scale(grouped_fit):
    fit, scale = grouped_fit, grouped_fit.scaling.scale
    raw = fit.raw.variables
    assert scale != 1.0  # the outcome was standardised
    for c, d in [(0, 0), (1, 17)]:
        sd, L = scale * raw["sd_g"][c, d], raw["L_g"][c, d]
        np.testing.assert_allclose(fit.posterior["u_g"][c, d], np.diag(sd) @ L @ raw["z_g"][c, d], rtol=1e-12)
        np.testing.assert_allclose(fit.posterior["cor_g"][c, d], L @ L.T, rtol=1e-12)
        np.testing.assert_allclose(fit.posterior["u_h"][c, d], scale * raw["sd_h"][c, d, :, None] * raw["z_h"][c, d],
                                   rtol=1e-12)
    assert "cor_h" not in fit.posterior


def test_summary_rows_are_named(grouped_fit):
    labels = list(grouped_fit.summary().index)
    assert labels == ["alpha", "b[x1]", "b[C(f)[T.b]]", "b[C(f)[T.c]]", "sd_g[Intercept]", "sd_g[x1]",
                      "cor_g[x1, Intercept]", *(f"u_g[{k}, {g}]" for k in ("Intercept", "x1") for g in "pqrs"),
                      "sd_h[Intercept]", "u_h[Intercept, 1]", "u_h[Intercept, 2]", "u_h[Intercept, 3]", "sigma"]
    row = grouped_fit.summary().loc["u_g[x1, r]"]
    assert row["mean"] == pytest.approx(grouped_fit.posterior["u_g"][:, :, 1, 2].mean(), rel=1e-12)


def test_posterior_coords_are_named(grouped_fit):
    posterior = grouped_fit.to_arviz().posterior
    assert list(posterior["b"].dims) == ["chain", "draw", "predictor"]
    assert list(posterior["predictor"].values) == ["x1", "C(f)[T.b]", "C(f)[T.c]"]
    assert list(posterior["u_g"].dims) == ["chain", "draw", "g_coef", "g_level"]
    assert list(posterior["g_level"].values) == ["p", "q", "r", "s"]
    assert list(posterior["cor_g"].dims) == ["chain", "draw", "g_coef", "g_coef_2"]
    assert list(posterior["h_level"].values) == ["1", "2", "3"]
    np.testing.assert_array_equal(posterior["u_g"].sel(g_coef="x1", g_level="q").values,
                                  grouped_fit.posterior["u_g"][:, :, 1, 1])


def numpy_linear_predictor(posterior, frame, fitted_levels):
    """alpha + X b + sum of Z u[level], row by row, with the columns built by hand."""
    eta = np.empty(posterior["alpha"].shape + (len(frame),))
    for i, (_, row) in enumerate(frame.iterrows()):
        x = np.array([row["x1"], row["f"] == "b", row["f"] == "c"], dtype=float)
        g, h = fitted_levels["g"].index(row["g"]), fitted_levels["h"].index(row["h"])
        eta[..., i] = (posterior["alpha"] + posterior["b"] @ x + posterior["u_g"][..., 0, g]
                       + row["x1"] * posterior["u_g"][..., 1, g] + posterior["u_h"][..., 0, h])
    return eta


def test_predict_mean_matches_numpy(grouped_fit, frame):
    new = frame.sample(7, random_state=3)
    predictions = grouped_fit.predict(new, kind="mean")
    expected = numpy_linear_predictor(grouped_fit.posterior, new, {"g": list("pqrs"), "h": [1, 2, 3]})
    np.testing.assert_allclose(predictions.draws, expected, rtol=1e-10, atol=1e-12)
    assert list(predictions.rows) == list(new.index)
    idata = predictions.to_arviz()
    assert list(idata.predictions["y_mean"].dims) == ["chain", "draw", "obs_new"]
    assert list(idata.predictions["obs_new"].values) == [str(i) for i in new.index]
    np.testing.assert_array_equal(idata.predictions_constant_data["X"].values, predictions.X)
    training = grouped_fit.predict()  # None: the training rows
    np.testing.assert_allclose(training.draws, numpy_linear_predictor(
        grouped_fit.posterior, frame, {"g": list("pqrs"), "h": [1, 2, 3]}), rtol=1e-10, atol=1e-12)


def test_predict_new_levels(grouped_fit, frame):
    new = frame.iloc[:4].assign(g=["new", "p", "new", "other"])
    with pytest.raises(RobustStanInputError, match=r"new_data: the grouping factor 'g' has the level\(s\) \['new', "
                                                   r"'other'\].*fit.predict\(..., new_levels='sample'\)"):
        grouped_fit.predict(new)
    one = grouped_fit.predict(new, new_levels="sample", seed=9).draws
    np.testing.assert_array_equal(one, grouped_fit.predict(new, new_levels="sample", seed=9).draws)
    # rows 0 and 2 share the level 'new': their effects are one draw (the same x1 slope and intercept)
    base = numpy_linear_predictor({**grouped_fit.posterior, "u_g": np.zeros_like(grouped_fit.posterior["u_g"])},
                                  new.assign(g="p"), {"g": list("pqrs"), "h": [1, 2, 3]})
    effect = one - base  # each row's intercept + x1 * slope of its level
    post = grouped_fit.posterior
    np.testing.assert_allclose(effect[..., 1], post["u_g"][..., 0, 0] + new["x1"].iloc[1] * post["u_g"][..., 1, 0],
                               rtol=1e-10, atol=1e-12)
    # the new levels' effects (intercept, slope) from rows 0 and 2 (x1 differs): solve for them
    x0, x2 = new["x1"].iloc[0], new["x1"].iloc[2]
    slope = (effect[..., 0] - effect[..., 2]) / (x0 - x2)
    intercept = effect[..., 0] - x0 * slope
    # drawn from N(0, diag(sd) L L' diag(sd)) at each draw: standardised, they are standard normal
    sd, L = post["sd_g"], post["L_g"]
    u = np.stack([intercept, slope], axis=-1)
    z = np.linalg.solve(sd[..., :, None] * L, u[..., None])[..., 0]
    assert abs(z.mean()) < 4 / np.sqrt(z.size) and abs(z.std() - 1) < 4 / np.sqrt(2 * z.size)
    # and uncorrelated (a draw that left out L would keep the correlation of L L')
    z = z.reshape(-1, 2)
    assert abs(np.corrcoef(z[:, 0], z[:, 1])[0, 1]) < 4 / np.sqrt(z.shape[0])
    with pytest.raises(RobustStanInputError, match="new_levels: must be one of"):
        grouped_fit.predict(new, new_levels="flag")
    with pytest.raises(RobustStanInputError, match="kind: must be one of"):
        grouped_fit.predict(new, kind="epred")


def test_predict_refuses_unseen_categories(grouped_fit, frame):
    with pytest.raises(RobustStanInputError, match=r"new_data: C\(f\) has the level\(s\) \['z'\]"):
        grouped_fit.predict(frame.iloc[:2].assign(f="z"))


@pytest.mark.parametrize("family", ["bernoulli", "poisson", "exponential", "binomial", "student_t"])
def test_predict_response_moments(family, frame):
    """Response draws have the family's mean and variance at each draw's linear predictor (one row,
    many posterior draws held at one value, so the draws are iid)."""
    rng = np.random.default_rng(7)
    shape, eta = (4, 5000), 0.4
    formula = "k ~ x1" if family == "bernoulli" else "n ~ x1" if family == "poisson" else (
        "k | trials(n) ~ x1" if family == "binomial" else "x2 ~ x1")
    variables = {"alpha": np.full(shape, eta), "b": np.zeros((*shape, 1))}
    if family == "student_t":
        variables.update(sigma=np.full(shape, 0.7), nu=np.full(shape, 5.0))
    fit = synthetic_fit(rs.glm(family, formula=formula, standardize=False), frame, variables)
    new = frame.iloc[:1].assign(n=4)
    draws = fit.predict(new, kind="response", seed=rng.integers(1 << 30)).draws[..., 0].ravel()
    p = 1 / (1 + np.exp(-eta))
    mean, variance = {"bernoulli": (p, p * (1 - p)), "poisson": (np.exp(eta), np.exp(eta)),
                      "exponential": (np.exp(eta), np.exp(2 * eta)), "binomial": (4 * p, 4 * p * (1 - p)),
                      "student_t": (eta, 0.49 * 5 / 3)}[family]
    np.testing.assert_allclose(fit.predict(new, kind="mean").draws, mean, rtol=1e-12)
    # 4.5 standard errors of the mean and of the variance (its sd from the fourth moment, bounded loosely by
    # the sample's own)
    assert abs(draws.mean() - mean) < 4.5 * np.sqrt(variance / draws.size)
    fourth = np.mean((draws - draws.mean()) ** 4)
    assert abs(draws.var() - variance) < 4.5 * np.sqrt((fourth - draws.var() ** 2) / draws.size)


def test_predict_mislabelled_bernoulli_is_the_observed_labels_probability(frame):
    shape = (1, 50)
    rng = np.random.default_rng(2)
    variables = {"alpha": rng.normal(size=shape), "b": rng.normal(size=(*shape, 1)),
                 "flip_rate": rng.uniform(0, 0.5, size=shape)}
    fit = synthetic_fit(rs.glm("bernoulli", formula="k ~ x1", mislabel=True), frame, variables)
    p = 1 / (1 + np.exp(-(variables["alpha"][..., None] + variables["b"] @ frame[["x1"]].to_numpy().T)))
    e = variables["flip_rate"][..., None]
    np.testing.assert_allclose(fit.predict(kind="mean").draws, p * (1 - e) + (1 - p) * e, rtol=1e-12)


# -- a plain X ------------------------------------------------------------------------------------

def test_x_dataframe_keeps_its_column_names(frame):
    X = frame[["x1", "x2"]].rename(columns={"x1": "dose", "x2": "age"})
    rng = np.random.default_rng(3)
    shape = (2, 20)
    variables = {"alpha": rng.normal(size=shape), "b": rng.normal(size=(*shape, 2)),
                 "sigma": rng.exponential(size=shape)}
    model = rs.glm("normal", standardize=False)
    fit = synthetic_fit(model, {"X": X, "y": frame["y"]}, variables)
    assert list(fit.summary().index) == ["alpha", "b[dose]", "b[age]", "sigma"]
    assert list(fit.to_arviz().posterior["predictor"].values) == ["dose", "age"]
    expected = variables["alpha"][..., None] + variables["b"] @ X.to_numpy().T
    np.testing.assert_allclose(fit.predict(X).draws, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fit.predict(X[["age", "dose"]]).draws, expected, rtol=1e-10, atol=1e-12)  # by name
    np.testing.assert_allclose(fit.predict(X.to_numpy()).draws, expected, rtol=1e-10, atol=1e-12)
    with pytest.raises(RobustStanInputError, match=r"new_data: X lacks the column\(s\) \['age'\]"):
        fit.predict(X[["dose"]])
    plain = synthetic_fit(model, {"X": X.to_numpy(), "y": frame["y"].to_numpy()}, variables)
    assert list(plain.summary().index) == ["alpha", "b[1]", "b[2]", "sigma"]
    with pytest.raises(RobustStanInputError, match="new_data: X has 3 columns; the model was fitted with 2"):
        plain.predict(np.zeros((4, 3)))


def test_predict_refused_for_other_models(frame):
    """A location model has no rows to predict; a program's predictions are its own generated quantities."""
    rng = np.random.default_rng(4)
    shape = (1, 5)
    location = synthetic_fit(rs.location("normal", standardize=False), {"y": frame["y"]},
                             {"mu": rng.normal(size=shape), "sigma": rng.exponential(size=shape)})
    with pytest.raises(RobustStanInputError, match="fit.predict: predictions for new rows are offered for rs.glm"):
        location.predict()


def softmax_rows(eta):
    e = np.exp(eta - eta.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("mislabel", [False, True])
def test_predict_categorical(frame, mislabel):
    """Class probabilities against a row-by-row softmax of (0, alpha + x B); class draws with them."""
    rng = np.random.default_rng(5)
    shape, K = (2, 4000), 3
    variables = {"alpha": rng.normal(size=(*shape, K - 1)), "B": rng.normal(size=(*shape, 2, K - 1))}
    if mislabel:
        variables["flip_rate"] = rng.uniform(0, (K - 1) / K, size=shape)
    data = frame.assign(c=rng.integers(1, K + 1, size=len(frame)))
    fit = synthetic_fit(rs.glm("categorical", formula="c ~ x1 + x2", mislabel=mislabel), data, variables)
    new = data.iloc[:3]
    mean = fit.predict(new).draws
    assert mean.shape == (*shape, 3, K)
    for i in range(3):
        x = new[["x1", "x2"]].to_numpy()[i]
        eta = np.concatenate([np.zeros((*shape, 1)), variables["alpha"] + np.einsum("p,...pk->...k", x,
                                                                                      variables["B"])], axis=-1)
        p = softmax_rows(eta)
        if mislabel:
            e = variables["flip_rate"][..., None]
            p = p * (1 - e) + (1 - p) * e / (K - 1)
        np.testing.assert_allclose(mean[..., i, :], p, rtol=1e-10, atol=1e-14)
    draws = fit.predict(new, kind="response", seed=1).draws
    assert draws.shape == (*shape, 3) and set(np.unique(draws)) <= {1, 2, 3}
    # the frequency of each class given the draws' probabilities: within 4.5 binomial standard errors
    for k in range(K):
        hit, p = (draws == k + 1).mean(axis=(0, 1)), mean[..., k].mean(axis=(0, 1))
        assert np.all(np.abs(hit - p) < 4.5 * np.sqrt(p * (1 - p) / draws[..., 0].size))
    idata = fit.predict(new).to_arviz()
    assert list(idata.predictions["c_mean"].dims) == ["chain", "draw", "obs_new", "class"]
    assert list(fit.summary().index)[:4] == ["alpha[1]", "alpha[2]", "B[x1, 1]", "B[x1, 2]"]
    with pytest.raises(RobustStanInputError, match="predictions: each row has several values"):
        fit.predict(new).mean()
    assert repr(fit.predict(new)).endswith("3 rows>")  # draws (chains, draws, rows, classes)


def test_predict_multi_normal(frame):
    shape, D = (1, 20000), 2
    L_omega = np.linalg.cholesky(np.array([[1.0, 0.6], [0.6, 1.0]]))
    variables = {"alpha": np.broadcast_to([1.0, -2.0], (*shape, D)).copy(),
                 "B": np.broadcast_to([[0.5, 0.0]], (*shape, 1, D)).copy(),
                 "tau": np.broadcast_to([2.0, 0.5], (*shape, D)).copy(),
                 "L_Omega": np.broadcast_to(L_omega, (*shape, D, D)).copy()}
    fit = synthetic_fit(rs.glm("multi_normal"), {"X": frame[["x1"]], "y": np.zeros((len(frame), D))}, variables)
    X_new = frame[["x1"]].iloc[:2]
    mean = fit.predict(X_new).draws
    np.testing.assert_allclose(mean[0, 0], np.array([1.0, -2.0]) + X_new.to_numpy() * np.array([0.5, 0.0]),
                               rtol=1e-12)
    draws = fit.predict(X_new, kind="response", seed=2).draws[0]  # (draws, 2 rows, D), iid given fixed parameters
    covariance = np.diag([2.0, 0.5]) @ L_omega @ L_omega.T @ np.diag([2.0, 0.5])
    for i in range(2):
        residual = draws[:, i] - mean[0, 0, i]
        se = np.sqrt(np.diag(covariance) / residual.shape[0])
        assert np.all(np.abs(residual.mean(axis=0)) < 4.5 * se)
        # the covariance within 4.5 standard errors (each element's variance (s_ij^2 + s_ii s_jj) / n)
        sampled = residual.T @ residual / residual.shape[0]
        bound = 4.5 * np.sqrt((covariance**2 + np.outer(np.diag(covariance), np.diag(covariance))) / residual.shape[0])
        assert np.all(np.abs(sampled - covariance) < bound)
    assert list(fit.predict(X_new).to_arviz().predictions["y_mean"].dims) == ["chain", "draw", "obs_new", "outcome_dim"]


# -- mends after review --------------------------------------------------------------------------

def test_a_row_subset_fit_predicts_its_own_rows(grouped_fit, frame):
    """A fit on some rows (a coreset's) predicts those rows by default, with their group levels."""
    model = grouped_fit.model
    rows = np.array([4, 0, 7])
    subset = model.with_row_weights(grouped_fit.prepared, rows, np.ones(3), rs.KL())
    assert list(subset.design.rows) == list(frame.index[rows])
    np.testing.assert_array_equal(subset.design.X, grouped_fit.prepared.design.X[rows])
    for term, whole in zip(subset.design.groups, grouped_fit.prepared.design.groups):
        np.testing.assert_array_equal(term.index, whole.index[rows])
        np.testing.assert_array_equal(term.Z, whole.Z[rows])
    fit = Fit(model, grouped_fit.raw, subset, grouped_fit.settings)
    np.testing.assert_allclose(fit.predict().draws, grouped_fit.predict().draws[..., rows], rtol=1e-12, atol=1e-12)


def test_a_column_named_intercept_is_refused(frame):
    with pytest.raises(RobustStanInputError, match="data: the formula reads a column named 'Intercept'"):
        rs.glm("normal", formula="y ~ Intercept + x1").prepare(frame.assign(Intercept=frame["x2"]))


def test_levels_with_one_name_are_refused(frame):
    mixed = frame.assign(g=pd.Series([1, "1"] * (len(frame) // 2), index=frame.index, dtype=object))
    with pytest.raises(RobustStanInputError, match=r"distinct levels of the grouping factor 'g' have the same name "
                                                   r"\['1'\]"):
        formula_design("y ~ x1 + (1 | g)", mixed)


def test_grouping_factors_get_ascii_stan_names():
    assert parse_formula("y ~ x + (1 | `café`)").group_stan_names == ("caf",)  # Stan names are ASCII


def test_custom_model_coefficients_are_not_named_after_x(frame):
    """Only a glm's b has one coefficient per column of X; a custom model's b is counted."""
    model = rs.custom("normal", data="int<lower=1> P; matrix[N, P] X;", parameters="vector[2] b; real<lower=0> s;",
                      priors="b ~ normal(0, 1); s ~ exponential(1);", mu="X[n, 1:2] * b", sigma="s")
    rng = np.random.default_rng(2)
    variables = {"b": rng.normal(size=(1, 5, 2)), "s": rng.exponential(size=(1, 5))}
    data = {"N": len(frame), "P": 3, "X": frame[["x1", "x2", "h"]], "y": frame["y"].to_numpy()}
    fit = synthetic_fit(model, data, variables)
    assert list(fit.summary().index) == ["b[1]", "b[2]", "s"]
    assert "predictor" not in fit.to_arviz().posterior.coords or list(
        fit.to_arviz().posterior["predictor"].values) == [0, 1]


def test_predict_on_an_unnamed_x_refuses_a_data_frame_and_a_series(frame):
    rng = np.random.default_rng(3)
    variables = {"alpha": rng.normal(size=(1, 4)), "b": rng.normal(size=(1, 4, 2)), "sigma": rng.exponential(size=(1, 4))}
    plain = synthetic_fit(rs.glm("normal", standardize=False),
                          {"X": frame[["x1", "x2"]].to_numpy(), "y": frame["y"].to_numpy()}, variables)
    with pytest.raises(RobustStanInputError, match="new_data: the model was fitted on an X without column names"):
        plain.predict(frame[["x1", "x2"]])
    with pytest.raises(RobustStanInputError, match="new_data: a pandas Series is read as one column"):
        plain.predict(frame[["x1", "x2"]].iloc[0])
