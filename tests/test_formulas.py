"""Formulas made design matrices (robust_stan.building.formulas), against designs built by hand
with NumPy and pandas: numeric, categorical, interaction, transformed and intercept-free terms,
group-level terms; new rows encoded as the training rows were; refusals naming what is wrong.
Also the Stan data of a design and the linear predictor at draws (robust_stan.methods.prediction)
against loops. Pure Python: nothing here compiles or runs Stan."""

import pickle

import numpy as np
import pandas as pd
import pytest

from robust_stan.building.formulas import (
    FormulaEncoding,
    design_stan_data,
    formula_design,
    group_data_names,
    parse_formula,
)
from robust_stan.common.errors import RobustStanInputError
from robust_stan.methods.prediction import group_effects, linear_predictor, new_level_effects


@pytest.fixture
def frame():
    rng = np.random.default_rng(56)
    n = 40
    return pd.DataFrame({
        "y": rng.normal(size=n),
        "x1": rng.normal(size=n),
        "x2": rng.uniform(0.5, 3.0, size=n),
        "g": rng.choice(["c", "a", "b"], size=n),      # met in no sorted order
        "h": rng.choice([3, 1, 2, 4], size=n),          # integer levels
        "k": rng.integers(0, 2, size=n),                # a bernoulli outcome
    }, index=pd.Index(np.arange(100, 100 + n), name="id"))


def dummies(values, levels) -> np.ndarray:
    """Indicator columns of ``levels`` (N, len(levels)), by hand."""
    values = np.asarray(values)
    return np.column_stack([(values == level).astype(float) for level in levels])


# -- the population-level part ---------------------------------------------------------------

def test_numeric_columns_and_outcome(frame):
    design = formula_design("y ~ x1 + x2", frame)
    np.testing.assert_array_equal(design.X, frame[["x1", "x2"]].to_numpy())
    assert design.columns == ("x1", "x2")
    assert design.intercept
    np.testing.assert_array_equal(design.y, frame["y"].to_numpy())
    assert design.groups == ()
    assert list(design.rows) == list(frame.index)


def test_integer_outcome_keeps_its_dtype(frame):
    design = formula_design("k ~ x1", frame)
    assert np.issubdtype(design.y.dtype, np.integer)
    np.testing.assert_array_equal(design.y, frame["k"].to_numpy())


def test_categorical_treatment_coding(frame):
    design = formula_design("y ~ x1 + C(g)", frame)
    expected = np.column_stack([frame["x1"], dummies(frame["g"], ["b", "c"])])  # a, the first sorted, is the base
    np.testing.assert_array_equal(design.X, expected)
    assert design.columns == ("x1", "C(g)[T.b]", "C(g)[T.c]")
    string_column = formula_design("y ~ g", frame)  # a string column is categorical without C()
    assert string_column.columns == ("g[T.b]", "g[T.c]")
    np.testing.assert_array_equal(string_column.X, dummies(frame["g"], ["b", "c"]))


def test_categorical_levels_given_in_the_formula(frame):
    design = formula_design("y ~ C(g, levels=['c', 'b', 'a'])", frame)
    np.testing.assert_array_equal(design.X, dummies(frame["g"], ["b", "a"]))
    assert design.columns == ("C(g, levels=['c', 'b', 'a'])[T.b]", "C(g, levels=['c', 'b', 'a'])[T.a]")


def test_interactions(frame):
    design = formula_design("y ~ x1 + x2 + x1:x2", frame)
    x1, x2 = frame["x1"].to_numpy(), frame["x2"].to_numpy()
    np.testing.assert_allclose(design.X, np.column_stack([x1, x2, x1 * x2]), rtol=0, atol=0)
    assert design.columns == ("x1", "x2", "x1:x2")
    crossed = formula_design("y ~ x1 * C(g)", frame)
    d = dummies(frame["g"], ["b", "c"])
    np.testing.assert_allclose(crossed.X, np.column_stack([x1, d, x1[:, None] * d]), rtol=0, atol=0)
    assert crossed.columns == ("x1", "C(g)[T.b]", "C(g)[T.c]", "x1:C(g)[T.b]", "x1:C(g)[T.c]")


def test_transformations(frame):
    design = formula_design("y ~ np.log(x2) + I(x1 ** 2) + center(x1)", frame)
    x1, x2 = frame["x1"].to_numpy(), frame["x2"].to_numpy()
    np.testing.assert_allclose(design.X, np.column_stack([np.log(x2), x1 ** 2, x1 - x1.mean()]), rtol=1e-15, atol=1e-15)
    assert design.columns == ("np.log(x2)", "I(x1 ** 2)", "center(x1)")
    outcome = formula_design("np.exp(y) ~ x1", frame)
    np.testing.assert_allclose(outcome.y, np.exp(frame["y"].to_numpy()), rtol=1e-15)


@pytest.mark.parametrize("formula", ["y ~ 0 + x1 + C(g)", "y ~ x1 + C(g) - 1"])
def test_no_intercept_gives_every_level_a_column(frame, formula):
    design = formula_design(formula, frame)
    assert not design.intercept
    np.testing.assert_array_equal(design.X, np.column_stack([frame["x1"], dummies(frame["g"], ["a", "b", "c"])]))
    assert design.columns == ("x1", "C(g)[a]", "C(g)[b]", "C(g)[c]")


def test_intercept_only(frame):
    design = formula_design("y ~ 1", frame)
    assert design.X.shape == (len(frame), 0) and design.columns == () and design.intercept


def test_dict_of_columns(frame):
    as_dict = {name: frame[name].to_numpy() for name in frame.columns}
    design = formula_design("y ~ x1 + C(g)", as_dict)
    np.testing.assert_array_equal(design.X, formula_design("y ~ x1 + C(g)", frame).X)


# -- group-level terms ----------------------------------------------------------------------

def test_group_intercept(frame):
    design = formula_design("y ~ x1 + (1 | g)", frame)
    assert design.columns == ("x1",)
    (term,) = design.groups
    assert (term.name, term.stan_name, term.coefficients, term.correlated) == ("g", "g", ("Intercept",), True)
    assert term.levels == ("a", "b", "c") and term.n_fitted_levels == 3
    np.testing.assert_array_equal(term.index, pd.Series(frame["g"]).map({"a": 0, "b": 1, "c": 2}).to_numpy())
    np.testing.assert_array_equal(term.Z, np.ones((len(frame), 1)))
    assert not term.new_rows.any()


def test_correlated_slope_and_integer_levels(frame):
    (term,) = formula_design("y ~ x1 + (x1 | h)", frame).groups
    assert term.coefficients == ("Intercept", "x1") and term.correlated
    assert term.levels == ("1", "2", "3", "4")  # sorted as numbers, named as text
    np.testing.assert_array_equal(term.index, frame["h"].to_numpy() - 1)
    np.testing.assert_array_equal(term.Z, np.column_stack([np.ones(len(frame)), frame["x1"]]))


def test_slope_only_and_uncorrelated(frame):
    slope, independent = formula_design("y ~ (0 + x1 | g) + (1 + x2 || h)", frame).groups
    assert slope.coefficients == ("x1",) and slope.correlated
    np.testing.assert_array_equal(slope.Z, frame[["x1"]].to_numpy())
    assert independent.coefficients == ("Intercept", "x2") and not independent.correlated


def test_categorical_varying_coefficients(frame):
    (term,) = formula_design("y ~ (C(g) | h)", frame).groups
    assert term.coefficients == ("Intercept", "C(g)[T.b]", "C(g)[T.c]")
    np.testing.assert_array_equal(term.Z, np.column_stack([np.ones(len(frame)), dummies(frame["g"], ["b", "c"])]))


def test_two_grouping_factors(frame):
    design = formula_design("y ~ x1 + (1 | g) + (1 | h)", frame)
    assert [t.name for t in design.groups] == ["g", "h"]
    np.testing.assert_array_equal(design.groups[1].index, frame["h"].to_numpy() - 1)


def test_crossed_and_nested_factors(frame):
    crossed = formula_design("y ~ (1 | g:h)", frame).groups[0]
    pairs = sorted(set(zip(frame["g"], frame["h"])))
    assert crossed.levels == tuple(f"{a}:{b}" for a, b in pairs)
    assert crossed.stan_name == "g_h"
    lookup = {pair: i for i, pair in enumerate(pairs)}
    np.testing.assert_array_equal(crossed.index, [lookup[pair] for pair in zip(frame["g"], frame["h"])])
    nested = formula_design("y ~ (1 | g/h)", frame).groups
    assert [t.name for t in nested] == ["g", "g:h"]
    np.testing.assert_array_equal(nested[1].index, crossed.index)


def test_backticked_names():
    frame = pd.DataFrame({"y": [1.0, 2, 3, 4], "my x": [1.0, 2, 3, 5], "my group": ["a", "b", "a", "b"]})
    design = formula_design("y ~ `my x` + (`my x` | `my group`)", frame)
    assert design.columns == ("my x",)
    (term,) = design.groups
    assert (term.name, term.stan_name, term.coefficients, term.levels) == ("my group", "my_group", ("Intercept", "my x"),
                                                                           ("a", "b"))
    np.testing.assert_array_equal(term.Z, np.column_stack([np.ones(4), frame["my x"]]))


def test_categorical_dtype_keeps_its_order(frame):
    frame = frame.assign(g=pd.Categorical(frame["g"], categories=["c", "unused", "b", "a"]))
    (term,) = formula_design("y ~ (1 | g)", frame).groups
    assert term.levels == ("c", "b", "a")  # the categories' order, those present
    np.testing.assert_array_equal(term.index, frame["g"].map({"c": 0, "b": 1, "a": 2}).to_numpy())


def test_parse_formula_parts():
    parsed = parse_formula("log(y) ~ (1|g) + x1 + f(x2, 3) + (x1 || h) + (0 + x1 | a/b)")
    assert parsed.outcome == "log(y)"
    assert parsed.fixed == "x1 + f(x2, 3)"
    assert [(t.expression, t.factor, t.correlated) for t in parsed.groups] == [
        ("1", "g", True), ("x1", "h", False), ("0 + x1", "a", True), ("0 + x1", "a:b", True)]
    assert parse_formula("y ~ (1 | g)").fixed == "1"
    assert parse_formula("y ~ x1 + (1 | g)").intercept and parse_formula("y ~ (1 | g)").intercept
    assert not parse_formula("y ~ 0 + x1 + (1 | g)").intercept and not parse_formula("y ~ x1 - 1").intercept
    with pytest.raises(RobustStanInputError, match="formula: formulaic cannot read 'x1 \\+'"):
        _ = parse_formula("y ~ x1 +").intercept
    assert parse_formula("~ x").outcome is None


# -- new data -------------------------------------------------------------------------------

FULL = "y ~ x1 * C(g) + np.log(x2) + center(x2) + (1 + x1 | h) + (1 | g:h)"


def test_new_rows_are_encoded_as_the_training_rows(frame):
    design = formula_design(FULL, frame)
    rows = np.random.default_rng(1).permutation(len(frame))[:7]
    new = frame.iloc[rows].drop(columns=["y"])  # a few rows, shuffled, without the outcome
    again = design.encoding.design(new)
    np.testing.assert_array_equal(again.X, design.X[rows])  # center(x2) keeps the training mean
    assert again.columns == design.columns and again.y is None
    for fitted, new_term in zip(design.groups, again.groups):
        np.testing.assert_array_equal(new_term.index, fitted.index[rows])
        np.testing.assert_array_equal(new_term.Z, fitted.Z[rows])
        assert new_term.levels == fitted.levels
    with_outcome = design.encoding.design(frame, outcome=True)
    np.testing.assert_array_equal(with_outcome.y, design.y)


def test_new_group_levels_flagged_or_refused(frame):
    encoding = formula_design("y ~ x1 + (1 | h) + (1 | g)", frame).encoding
    new = pd.DataFrame({"x1": [0.1, 0.2, 0.3, 0.4], "h": pd.Series([2, 9, 7, 9.0], dtype=object).to_numpy(),
                        "g": ["a", "b", "c", "a"]}, index=["r1", "r2", "r3", "r4"])
    with pytest.raises(RobustStanInputError, match=r"data: the grouping factor 'h' has the level\(s\) \['9', '7'\].*"
                                                   r"rows r2, r3, r4.*new_levels='sample'"):
        encoding.design(new)
    h, g = encoding.design(new, new_levels="flag").groups
    np.testing.assert_array_equal(h.index, [1, 4, 5, 4])  # 9 and 9.0 are one new level
    assert h.levels == ("1", "2", "3", "4", "9", "7") and h.n_fitted_levels == 4
    np.testing.assert_array_equal(h.new_rows, [False, True, True, True])
    assert not g.new_rows.any()
    as_floats = encoding.design(new.assign(h=[2.0, 1.0, 4.0, 3.0])).groups[0]  # levels are values, not their text
    np.testing.assert_array_equal(as_floats.index, [1, 0, 3, 2])


def test_encoding_survives_pickling(frame):
    encoding = formula_design(FULL, frame).encoding
    copy = pickle.loads(pickle.dumps(encoding))
    assert isinstance(copy, FormulaEncoding)
    np.testing.assert_array_equal(copy.design(frame).X, encoding.design(frame).X)
    assert copy.columns == encoding.columns and copy.intercept


# -- refusals ---------------------------------------------------------------------------------

def test_missing_values_name_the_rows(frame):
    frame = frame.astype({"g": object})
    frame.loc[103, "x1"] = np.nan
    frame.loc[107, "g"] = None
    frame.loc[110, "y"] = np.nan
    with pytest.raises(RobustStanInputError, match=r"data: missing values .* \['y', 'x1', 'g'\] at rows 103, 107, 110"):
        formula_design("y ~ x1 + (1 | g)", frame)
    frame.loc[[107, 110], ["g", "y"]] = ["a", 0.0]
    with pytest.raises(RobustStanInputError, match=r"new_data: missing values .* \['x1'\] at rows 103 "):
        formula_design("y ~ x1", frame.drop(index=103)).encoding.design(frame, argument="new_data")


def test_missing_value_in_a_column_the_formula_does_not_read_is_fine(frame):
    frame = frame.assign(unused=np.nan)
    assert formula_design("y ~ x1", frame).X.shape == (len(frame), 1)


def test_non_finite_transformation_names_the_rows(frame):
    frame.loc[105, "x2"] = 0.0
    with pytest.raises(RobustStanInputError, match=r"\['np.log\(x2\)'\] are not finite .* rows 105 "):
        formula_design("y ~ np.log(x2)", frame)


def test_new_category_of_a_predictor_is_refused(frame):
    encoding = formula_design("y ~ C(g)", frame).encoding
    new = pd.DataFrame({"g": ["a", "z"]}, index=[7, 8])
    with pytest.raises(RobustStanInputError, match=r"C\(g\) has the level\(s\) \['z'\].* rows 8 "):
        encoding.design(new)


@pytest.mark.parametrize("formula, message", [
    ("x1 + x2", "no '~'"),
    ("~ x1", "has no outcome"),
    ("y ~ x1 ~ x2", "more than one '~'"),
    ("y ~ (x1 + x2", "unbalanced"),
    ("y ~ x1 - (1 | g)", "can only be added .* not joined by '-'"),
    ("y ~ x1:(1 | g)", "not joined by ':'"),
    ("y ~ (1 | g) + (x1 | g)", "'g' appears in '\\(1 \\| g\\)' and '\\(x1 \\| g\\)'"),
    ("y ~ ( | g)", "nothing left of '\\|'"),
    ("y ~ (1 | g + h)", "must be column names"),
    ("y ~ (0 | g)", "no varying coefficient"),
    ("y ~ x3", "formulaic cannot build .*x3"),
    ("y ~ x1 +", "formulaic cannot build"),
    ("g ~ x1", "must be one numeric column"),
])
def test_bad_formulas(frame, formula, message):
    with pytest.raises(RobustStanInputError, match="formula: .*" + message):
        formula_design(formula, frame)


def test_bad_arguments(frame):
    with pytest.raises(RobustStanInputError, match="formula: expected a formula"):
        formula_design(3, frame)
    with pytest.raises(RobustStanInputError, match="data: a formula needs a pandas DataFrame"):
        formula_design("y ~ x1", [[1, 2]])
    with pytest.raises(RobustStanInputError, match=r"data: the group-level term '\(1 \| q\)' reads .*\['q'\]"):
        formula_design("y ~ x1 + (1 | q)", frame)
    encoding = formula_design("y ~ x1", frame).encoding
    with pytest.raises(RobustStanInputError, match="new_levels: must be one of"):
        encoding.design(frame, new_levels="sample")
    with pytest.raises(RobustStanInputError, match=r"new_data: the formula 'y ~ x1' reads the column\(s\) \['x1'\]"):
        encoding.design(frame.drop(columns=["x1"]), argument="new_data")
    with pytest.raises(RobustStanInputError, match="has no outcome"):
        FormulaEncoding.from_data("~ x1", frame).design(frame, outcome=True)


# -- Stan data ---------------------------------------------------------------------------------

def test_design_stan_data(frame):
    design = formula_design("y ~ x1 + C(g) + (1 + x1 | h) + (1 | g:h)", frame)
    data = design_stan_data(design)
    assert sorted(data) == sorted(["y", "X", "G_h", "K_h", "J_h", "Z_h", "G_g_h", "K_g_h", "J_g_h", "Z_g_h"])
    np.testing.assert_array_equal(data["J_h"], frame["h"].to_numpy())  # levels 1..4 are 1-based already
    assert (data["G_h"], data["K_h"]) == (4, 2)
    assert data["G_g_h"] == len(set(zip(frame["g"], frame["h"]))) and data["J_g_h"].min() == 1
    np.testing.assert_array_equal(data["Z_h"], np.column_stack([np.ones(len(frame)), frame["x1"]]))
    assert group_data_names("h") == {"G": "G_h", "K": "K_h", "J": "J_h", "Z": "Z_h"}
    new = frame.assign(h=np.where(frame.index == 104, 11, frame["h"]))
    flagged = design.encoding.design(new, new_levels="flag")
    with pytest.raises(RobustStanInputError, match=r"'h' has levels the model was not fitted to, at rows 104 "):
        design_stan_data(flagged)


# -- the linear predictor at draws ---------------------------------------------------------------

def test_group_effects_are_diag_sd_L_z():
    rng = np.random.default_rng(3)
    z, sd = rng.normal(size=(2, 5, 3, 4)), rng.uniform(0.5, 2, size=(2, 5, 3))
    L = np.linalg.cholesky(np.array([[1, 0.3, -0.2], [0.3, 1, 0.5], [-0.2, 0.5, 1]]))
    u = group_effects(z, sd, np.broadcast_to(L, (2, 5, 3, 3)))
    for c, d, k, level in np.ndindex(2, 5, 3, 4):
        expected = sd[c, d, k] * sum(L[k, j] * z[c, d, j, level] for j in range(3))
        assert abs(u[c, d, k, level] - expected) < 1e-14
    np.testing.assert_array_equal(group_effects(z, sd), sd[..., None] * z)


def test_new_level_effects_follow_the_group_distribution():
    sd = np.array([0.5, 2.0])
    L = np.linalg.cholesky(np.array([[1.0, 0.6], [0.6, 1.0]]))
    draws = 20000
    u = new_level_effects(np.broadcast_to(sd, (draws, 2)), np.broadcast_to(L, (draws, 2, 2)), 1,
                          np.random.default_rng(4))[..., 0]
    covariance = np.diag(sd) @ L @ L.T @ np.diag(sd)
    se = np.sqrt((np.outer(np.diag(covariance), np.diag(covariance)) + covariance ** 2) / draws)
    assert np.all(np.abs(np.cov(u.T) - covariance) < 5 * se)
    assert np.all(np.abs(u.mean(axis=0)) < 5 * sd / np.sqrt(draws))


def test_linear_predictor_against_a_loop(frame):
    design = formula_design("y ~ x1 + C(g) + (1 + x1 | h) + (1 | g)", frame)
    rng = np.random.default_rng(5)
    chains, draws, p = 2, 3, design.X.shape[1]
    alpha, b = rng.normal(size=(chains, draws)), rng.normal(size=(chains, draws, p))
    effects = {"h": rng.normal(size=(chains, draws, 2, 4)), "g": rng.normal(size=(chains, draws, 1, 3))}
    assert [term.stan_name for term in design.groups] == ["h", "g"]
    eta = linear_predictor(design, alpha, b, effects)
    x1, hs, gs = frame["x1"].to_numpy(), frame["h"].to_numpy(), frame["g"].to_numpy()
    for c, d, n in np.ndindex(chains, draws, len(frame)):
        expected = alpha[c, d] + sum(design.X[n, j] * b[c, d, j] for j in range(p))
        expected += effects["h"][c, d, 0, hs[n] - 1] + x1[n] * effects["h"][c, d, 1, hs[n] - 1]
        expected += effects["g"][c, d, 0, "abc".index(gs[n])]
        assert abs(eta[c, d, n] - expected) < 1e-12
    without_intercept = linear_predictor(design, None, b, effects)
    np.testing.assert_allclose(without_intercept, eta - alpha[..., None], rtol=0, atol=1e-12)


def test_linear_predictor_of_new_levels_uses_their_columns(frame):
    encoding = formula_design("y ~ x1 + (1 | g)", frame).encoding
    new = encoding.design(pd.DataFrame({"x1": [0.0, 0.0, 0.0], "g": ["b", "new", "new"]}), new_levels="flag")
    u = np.array([[[10.0, 20.0, 30.0, 40.0]]])  # one draw: a, b, c fitted, then "new"
    eta = linear_predictor(new, np.zeros(1), np.zeros((1, 1)), {"g": u})
    np.testing.assert_array_equal(eta, [[20.0, 40.0, 40.0]])  # rows of one new level share its draw
    with pytest.raises(RobustStanInputError, match="needs \\(1, >= 4\\) effects per draw"):
        linear_predictor(new, np.zeros(1), np.zeros((1, 1)), {"g": u[..., :3]})
    with pytest.raises(RobustStanInputError, match="no effects of the group-level term 'g'"):
        linear_predictor(new, np.zeros(1), np.zeros((1, 1)), {})


# -- the group-level terms' Stan fragments (stanc checks them in tests/test_formula_models.py) ------

def group_term_spec(terms):
    """A normal glm's ModelSpec with the group-level terms' fragments, as the wiring will build it."""
    from robust_stan.building.families import get_family
    from robust_stan.building.spec import Argument, ModelSpec, ParameterDeclaration

    data = "; ".join(["int<lower=0> P", "matrix[N, P] X", "vector<lower=0>[P] prior_scale_b",
                      *(line for term in terms for line in term.data)])
    declarations = ["real alpha", "vector[P] b", "real<lower=0> sigma", *(d for t in terms for d in t.parameters)]
    priors = ["alpha ~ normal(0, 2.5);", "b ~ normal(0, prior_scale_b);", "sigma ~ exponential(1);"]
    priors += [f"{name} ~ {prior};" for t in terms for name, prior in t.default_priors.items()]
    priors += [t.standard_normal for t in terms]
    mu = " + ".join(["alpha + X[n] * b", *(t.per_observation for t in terms)])
    mu_vec = " + ".join(["alpha + X * b", *(t.vectorised for t in terms)])
    return ModelSpec(family=get_family("normal"), data=data,
                     parameters=[ParameterDeclaration.parse(d) for d in declarations], priors="\n".join(priors),
                     args={"mu": Argument("mu", mu, mu_vec), "sigma": Argument("sigma", "sigma")}, title="group terms")


def test_group_term_fragments():
    from robust_stan.building.group_terms import GroupTermStan
    from robust_stan.building.spec import ParameterDeclaration

    correlated, independent = GroupTermStan("g"), GroupTermStan("g_h", correlated=False)
    assert [ParameterDeclaration.parse(d).name for d in correlated.parameters] == ["z_g", "sd_g", "L_g"]
    assert ParameterDeclaration.parse(correlated.parameters[2]).local_type() == "matrix[K_g, K_g]"
    assert [ParameterDeclaration.parse(d).name for d in independent.parameters] == ["z_g_h", "sd_g_h"]
    assert correlated.default_priors == {"sd_g": "exponential(1)", "L_g": "lkj_corr_cholesky(2)"}
    assert independent.default_priors == {"sd_g_h": "exponential(1)"}
    assert independent.rescale("scale") == {"sd_g_h": "scale"} and independent.rescale(None) == {}
    assert correlated.per_observation == "Z_g[n] * (diag_pre_multiply(sd_g, L_g) * col(z_g, J_g[n]))"
    assert independent.vectorised == "rows_dot_product(diag_post_multiply(Z_g_h, sd_g_h), z_g_h[:, J_g_h]')"
    spec = group_term_spec([correlated, independent])
    spec.check()
    assert {"G_g", "K_g", "J_g", "Z_g", "J_g_h", "Z_g_h"} <= set(spec.data_names())
    assert {"J_g", "Z_g", "J_g_h", "Z_g_h"} <= set(spec.row_data_names())  # minibatches slice them
    assert not {"G_g", "K_g"} & set(spec.row_data_names())


def test_group_term_program_renders():
    """The template takes the fragments (rendering only: jinja, no stanc)."""
    from robust_stan.building.codegen import render_program
    from robust_stan.building.group_terms import GroupTermStan

    program = render_program(group_term_spec([GroupTermStan("g")]))
    assert "array[n_copies] cholesky_factor_corr[K_g] L_g_copies;" in program
    assert "array[N] int<lower=1, upper=G_g> J_g;" in program
    assert "rows_dot_product(Z_g * diag_pre_multiply(sd_g, L_g), z_g[:, J_g]')" in program


# -- against formulae (bambi's formula library): an independent implementation of the same notation --

@pytest.mark.parametrize("formula", [
    "y ~ x1 + C(g) + x1:C(g) + np.log(x2) + (1 + x1 | g) + (1 | h)",
    "y ~ 0 + C(g) + x2 + (0 + x1 | h) + (1 | g:h)",
])
def test_designs_equal_those_of_formulae(frame, formula):
    """A worked example of brms' notation, built by formulae (bambi's formula library, written
    independently of formulaic and of our group-term parser) and by us, column by column: the same
    population-level columns under the same names (formulae writes a treatment level C(g)[b] where
    formulaic writes C(g)[T.b], and keeps the formula's order where formulaic puts main effects
    first) and, for each group-level term, the same per-level columns: formulae's column of
    coefficient k and level l is our Z[:, k] on the rows of level l, and zero elsewhere."""
    import formulae  # a test dependency (the test extra)
    design = formula_design(formula, frame)
    theirs = formulae.design_matrices(formula, frame)
    their_common = np.asarray(theirs.common.design_matrix)
    their_names = [label for term in theirs.common.terms.values() for label in term.labels]
    ours = dict(zip(design.columns, design.X.T)) | ({"Intercept": np.ones(len(frame))} if design.intercept else {})
    assert sorted(name.replace("[T.", "[") for name in ours) == sorted(their_names)
    for name, column in ours.items():
        np.testing.assert_allclose(column, their_common[:, their_names.index(name.replace("[T.", "["))],
                                   rtol=1e-15, atol=0, err_msg=name)
    their_group_terms = set(theirs.group.terms)
    for term in design.groups:
        for k, coefficient in enumerate(term.coefficients):
            label = f"{'1' if coefficient == 'Intercept' else coefficient}|{term.name}"
            their_group_terms.remove(label)
            labels = theirs.group.terms[label].labels
            assert len(labels) == len(term.levels), label
            expanded = theirs.group[label]
            expanded = expanded.toarray() if hasattr(expanded, "toarray") else np.asarray(expanded)  # sparse in 0.9
            for level_index, level in enumerate(term.levels):
                parts = zip(term.name.split(":"), str(level).split(":"))
                column_label = f"{label.split('|')[0]}|" + ":".join(f"{column}[{part}]" for column, part in parts)
                column = expanded[:, labels.index(column_label)]
                expected = np.where(term.index == level_index, term.Z[:, k], 0.0)
                np.testing.assert_allclose(column, expected, rtol=1e-15, atol=0, err_msg=column_label)
    assert not their_group_terms  # formulae found no term we did not
