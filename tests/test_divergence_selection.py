"""rs.select_divergence by the H-score on real Stan fits: the program's y-derivatives against finite
differences, the H-score of the KL loss against its closed form, reweighted grid values against
full fits, the refit when k-hat is large, and bad input."""

from types import SimpleNamespace

import numpy as np
import pytest

import robust_stan as rs
from robust_stan.api.select_divergence import _warm_start
from robust_stan.building.data import with_switches
from robust_stan.building.divergences import DivergenceCode
from robust_stan.engines.base import parameter_columns
from robust_stan.methods.selection.divergence import (
    Evaluation,
    GridPoint,
    _best_below_a_rise,
    grid_value,
    loss_y_derivatives,
    walk_grid,
)

from .conftest import ENGINE

SAMPLE = dict(chains=4, iter_warmup=400, iter_sampling=500, seed=3)


def _contaminated(n=100, seed=0):
    rng = np.random.default_rng(seed)
    y = 1.0 + 0.7 * rng.normal(size=n)
    y[: n // 10] += 6.0
    return {"y": y}


def _quantities_at(model, stan_data, columns, y, divergence):
    """The program's generated quantities at constrained ``columns`` with the outcome replaced by ``y``."""
    data = with_switches(dict(stan_data, y=y), pointwise=2, divergence=divergence)
    return model.compile().generated_quantities(data, columns, 1)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")  # 20 draws: points to differentiate at
@pytest.mark.parametrize("family, known", [("normal", {}), ("student_t", {"sigma": 1.5})])
def test_y_derivatives_against_finite_differences(family, known):
    """The program's closed-form d/dy and d^2/dy^2 of log p (robust_<family>_pointwise_y_score), and
    the loss derivatives built from them for beta and gamma, against central differences of the
    program's own log_lik and robust_loss in y, at h = 1e-4: truncation h^2 |f'''| / 6 and
    h^2 |f''''| / 12 are below 1e-7 for these densities, rounding 2 eps |f| / h^2 below 2e-7 (|f| < 5)."""
    model = rs.location(family, known=known, standardize=False, engine=ENGINE)
    data = _contaminated(40)
    fit = model.sample(data, chains=1, iter_warmup=200, iter_sampling=20, seed=1, show_progress=False)
    columns = parameter_columns(fit.raw.variables, [f"{p.name}_copies" for p in model.spec.parameters])
    y, h = data["y"], 1e-4
    for divergence in (rs.KL(), rs.BetaD(0.4), rs.GammaD(0.3)):
        at = {shift: _quantities_at(model, fit.stan_data, columns, y + shift, divergence) for shift in (-h, 0.0, h)}
        if divergence.code == DivergenceCode.KL:
            log_p = {shift: q["log_lik"] for shift, q in at.items()}
            score = at[0.0]["y_score"]
            np.testing.assert_allclose(score[..., 0], (log_p[h] - log_p[-h]) / (2 * h), rtol=0, atol=1e-6)
            np.testing.assert_allclose(score[..., 1], (log_p[h] - 2 * log_p[0.0] + log_p[-h]) / h**2, rtol=0, atol=1e-5)
        minus_loss = {shift: -q["robust_loss"] for shift, q in at.items()}
        first, second = loss_y_derivatives(at[0.0]["log_lik"], at[0.0]["robust_loss"], at[0.0]["y_score"], divergence)
        np.testing.assert_allclose(first, (minus_loss[h] - minus_loss[-h]) / (2 * h), rtol=0, atol=1e-6)
        np.testing.assert_allclose(second, (minus_loss[h] - 2 * minus_loss[0.0] + minus_loss[-h]) / h**2,
                                   rtol=0, atol=1e-5)


@pytest.mark.stan
def test_hscore_of_the_kl_loss_is_its_closed_form():
    """For a normal model and the KL loss, H_i = -2 / sigma^2 + (y_i - mu)^2 / sigma^4; the criterion
    is its sum over rows averaged over the draws, on the outcome's own scale (the model
    standardises y, so this also checks the change of scale), to 1e-9 relative."""
    model = rs.location("normal", engine=ENGINE)
    data = _contaminated()
    selection = rs.select_divergence(model, data, grid=[rs.KL()], fits="full", **SAMPLE)
    fit = selection.fits[rs.KL()]
    mu, sigma = fit.posterior["mu"][..., None], fit.posterior["sigma"][..., None]
    closed_form = (-2 / sigma**2 + (data["y"] - mu) ** 2 / sigma**4).sum(axis=-1).mean()
    assert selection.curve["criterion"].iloc[0] == pytest.approx(closed_form, rel=1e-9)
    assert selection.curve["source"].iloc[0] == "fit"


@pytest.mark.stan
def test_reweighted_values_agree_with_full_fits():
    """Four grid values, one fitted: the three reweighted values against fits at those values,
    within 4 combined Monte Carlo errors; only one NUTS fit ran."""
    model = rs.location("normal", engine=ENGINE)
    data = _contaminated()
    grid = [rs.BetaD(0.2), rs.BetaD(0.25), rs.BetaD(0.3), rs.BetaD(0.35)]
    reweighted = rs.select_divergence(model, data, grid=grid, pilot=0.3, confirm=False, **SAMPLE)
    full = rs.select_divergence(model, data, grid=grid, fits="full", **SAMPLE)
    assert len(reweighted.fits) == 1 and len(full.fits) == 4
    assert list(reweighted.curve["source"]) == ["reweighted from BetaD(0.3)"] * 2 + ["fit",
                                                                                     "reweighted from BetaD(0.3)"]
    reweighted_rows = [0, 1, 3]
    a, b = reweighted.curve.iloc[reweighted_rows], full.curve.iloc[reweighted_rows]
    assert np.all(a["pareto_k"] <= 0.7)
    allowed = 4 * np.hypot(a["mcse"], b["mcse"])
    assert np.all(np.abs(a["criterion"] - b["criterion"]) <= allowed), (a, b)


@pytest.mark.stan
def test_a_large_step_calls_for_a_new_fit_and_the_choice_resists_outliers():
    """From KL to beta = 1 on data with a tenth of gross outliers the posteriors barely overlap:
    the reweighting's k-hat exceeds 0.7 and a fit is made at each value. The H-score prefers the
    robust posterior (Yonekura and Sugasawa's point: the non-robust fit explains the outliers by
    a wide sigma, which costs it in the score), and the fit at the choice ignores the outliers."""
    model = rs.location("normal", engine=ENGINE)
    data = _contaminated()
    selection = rs.select_divergence(model, data, grid=[rs.KL(), rs.BetaD(1.0)], pilot=rs.KL(), **SAMPLE)
    assert [source[:3] for source in selection.curve["source"]] == ["fit", "fit"]   # the choice: also confirmed
    assert selection.curve["pareto_k"].iloc[1] > 0.7
    assert selection.divergence == rs.BetaD(1.0)
    assert abs(selection.fit.summary().loc["mu", "mean"] - 1.0) < 0.3  # the clean rows' centre; KL's is 1.6


def _leverage_data():
    """200 rows of y = 1 + X b + N(0, 1), b = (1, -0.5, 0.25), a tenth of them at x = (4, 4, 4), y = -10."""
    rng = np.random.default_rng([3, 7, 2])
    X = rng.normal(size=(200, 3))
    y = 1.0 + X @ np.array([1.0, -0.5, 0.25]) + rng.normal(size=200)
    X[:20], y[:20] = 4.0, -10.0
    return {"X": X, "y": y}


@pytest.mark.stan
def test_a_value_whose_mass_lies_in_another_mode_is_not_reweighted_from_a_fit_outside_it():
    """High-leverage outliers: near beta = 0.1 the generalized posterior's heavier mode follows them
    (mean lp__ 1542 there against 1473 in the clean mode, on this data set), and draws reweighted
    from the robust pilot at 0.5 see only the clean mode (k-hat cannot flag a mode they never
    visit): before the mode census, the unconfirmed choice was 0.1, a beta whose own posterior
    follows the outliers. With the census, 0.1 is fitted (no fit lies in its mode) and scores its
    own mode, the choice is a larger beta whose fit, started in its largest mode, ignores the
    outliers (the clean rows' posterior sd of b1 is about 0.08, so 0.3 is about 4 of them), and
    confirming the choice adds at most its own fit."""
    data = _leverage_data()
    model = rs.glm("normal", engine=ENGINE)
    options = dict(chains=4, iter_warmup=500, iter_sampling=1000, seed=1)
    grid = [0.1, 0.2, 0.3, 0.4, 0.5]
    unconfirmed = rs.select_divergence(model, data, grid=grid, pilot=0.5, confirm=False, **options)
    assert unconfirmed.curve["source"].iloc[0] == "fit"
    assert abs(unconfirmed.fits[rs.BetaD(0.1)].posterior["b"][..., 0].mean() - 1.0) > 0.5   # it follows them
    assert grid_value(unconfirmed.divergence) > 0.1
    confirmed = rs.select_divergence(model, data, grid=grid, pilot=0.5, **options)
    assert confirmed.divergence == unconfirmed.divergence and len(confirmed.fits) <= len(unconfirmed.fits) + 1
    chosen = confirmed.curve[confirmed.curve["divergence"] == repr(confirmed.divergence)].iloc[0]
    assert chosen["source"].startswith("fit")
    b1 = confirmed.fit.posterior["b"][..., 0]
    assert abs(b1.mean() - 1.0) < 0.3 and confirmed.fit.summary()["r_hat"].max() < 1.01
    # the plot fills every fitted value, the confirming fit included
    fitted_markers = next(line for line in confirmed.plot().lines if line.get_label() == "NUTS fit")
    assert len(fitted_markers.get_xdata()) == confirmed.curve["source"].str.startswith("fit").sum() >= 2


def _two_mode_evaluation(rng):
    """The stand-in engine's evaluation: criterion 10 in the outlier mode and 10 beta - 20 in the clean
    one (Monte Carlo error about 0.007); reweighting exact (equal total losses) except from an
    outlier-mode fit to beta < 0.25, whose total losses spread wildly (k-hat far above 0.7)."""
    def evaluate(mode, divergence):
        beta = grid_value(divergence)
        level = 10.0 if mode == "outliers" else 10 * beta - 20
        spread = 10.0 if mode == "outliers" and beta < 0.25 else 1e-3
        return Evaluation(spread * rng.standard_t(2, size=(2, 200)), level + 0.1 * rng.normal(size=(2, 200)))

    return evaluate


class _StandInModes:
    """A stand-in for the mode census: below beta = 0.45 the outlier mode holds the mass, above it
    the clean one; ``several`` values have no dominant mode."""

    def __init__(self, grid, several=()):
        self.positions = [grid_value(d) for d in grid]
        self.several_values = several

    def several(self, k):
        return "its posterior has several modes (shares 0.6, 0.4)" if self.positions[k] in self.several_values \
            else None

    def holds(self, k, fit):
        return (fit == "outliers") == (self.positions[k] < 0.45)

    def mode_count(self, k):
        return 2


def test_the_census_sends_each_value_to_a_fit_in_its_mode():
    """The walk with a census, on the stand-in engine of the next test (a fit's mode is decided by
    its value: outliers below 0.45, clean above; criterion 10 in the outlier mode, 10 beta - 20 in
    the clean one; reweighting exact except from an outlier-mode fit to beta < 0.25). From the
    clean pilot at 1.0: 0.9-0.5 are reweighted from it, 0.7 has no dominant mode and is left out;
    0.4 has no fit in its mode and is fitted; 0.3 is reweighted from it; 0.2 and 0.1 have k-hat far
    above 0.7 and are fitted; every fit is one of its own, so the confirmation fits only the best
    value, 0.5, and it stands."""
    grid = [rs.BetaD(b / 10) for b in range(1, 11)]
    evaluate = _two_mode_evaluation(np.random.default_rng(0))
    fitted = []

    def fit_at(divergence, nearest):
        assert nearest is None   # with a census every fit is one of its own
        fitted.append(grid_value(divergence))
        return "outliers" if grid_value(divergence) < 0.45 else "clean"

    points, _fits = walk_grid(grid, 9, fit_at, evaluate, modes=_StandInModes(grid, several=(0.7,)))
    assert fitted == [1.0, 0.4, 0.2, 0.1, 0.5]
    assert np.isnan(points[6].criterion) and points[6].source == ("not evaluated: its posterior has several modes "
                                                                  "(shares 0.6, 0.4)")
    assert points[3].source == "fit" and np.isnan(points[3].pareto_k)       # no fit in its mode: none tried
    assert points[2].source == "reweighted from BetaD(0.4)"
    assert points[1].source == "fit" and points[1].pareto_k > 0.7
    np.testing.assert_allclose([p.criterion for p in points[:4]], 10.0, atol=0.05)
    assert points[4].source.startswith("fit of its own") and abs(points[4].criterion + 15) < 0.05


def test_confirmation_bisects_after_a_breakdown():
    """The confirming walk's bookkeeping, on a stand-in for the engine whose answers are known: a
    fit from dispersed starts follows the outliers below beta = 0.45 (criterion 10), one in the
    clean mode scores 10 beta - 20 (best at the smallest beta), and reweighting is exact (equal
    total losses, k-hat small) except from an outlier-mode fit to beta < 0.25, where the total
    losses differ wildly (k-hat far above 0.7). Reweighted from the clean pilot at 1.0, every value
    looks clean, so 0.1 is probed and breaks down; then the suspects 0.2-0.9 are bisected: 0.6
    (clean), 0.4 (breaks down: 0.3 is re-evaluated from its draws, 0.2 cannot be and is left out
    as NaN), 0.5 (clean). Five fits in all, where confirming the best value one grid step at a time
    took six (0.1, 0.2, 0.3, 0.4, 0.5 after the pilot); the choice, 0.5, is the same."""
    from robust_stan.results.selection import Selection

    grid = [rs.BetaD(b / 10) for b in range(1, 11)]
    evaluate = _two_mode_evaluation(np.random.default_rng(0))
    fitted = []

    def fit_at(divergence, nearest):
        fitted.append(grid_value(divergence))
        if nearest is not None:
            return nearest
        return "outliers" if grid_value(divergence) < 0.45 else "clean"

    points, _fits = walk_grid(grid, 9, fit_at, evaluate)
    assert fitted == [1.0, 0.1, 0.6, 0.4, 0.5]
    criteria = np.array([p.criterion for p in points])
    assert np.isnan(criteria[1]) and points[1].source.startswith("not evaluated: below the breakdown found at "
                                                                 "BetaD(0.4)") and points[1].pareto_k > 0.7
    assert "below the breakdown found at BetaD(0.4)" in points[2].source
    np.testing.assert_allclose(criteria[[0, 2, 3]], 10.0, atol=0.05)   # the outlier mode's, each from a fit there
    np.testing.assert_allclose(criteria[4:], 10 * np.arange(5, 11) / 10 - 20, atol=0.05)
    assert points[4].source.startswith("fit of its own")
    # the Selection chooses past the NaN
    assert Selection("hscore", points, {}, lambda divergence: None).divergence == rs.BetaD(0.5)


def _stand_in(seed: int, unreliable: tuple, level):
    """A stand-in for the engine: a "fit" is its own grid value; reweighting from another fit to a
    value in ``unreliable`` has wildly spread total losses (k-hat far above 0.7) and is exact
    otherwise; the criterion is level(beta) with a Monte Carlo error of about 0.007. Returns
    fit_at, evaluate and the list of the values fitted."""
    rng = np.random.default_rng(seed)
    fitted = []

    def fit_at(divergence, nearest):
        fitted.append(grid_value(divergence))
        return grid_value(divergence)

    def evaluate(fitted_at, divergence):
        beta = grid_value(divergence)
        spread = 10.0 if round(beta, 6) in unreliable and round(fitted_at, 6) != round(beta, 6) else 1e-3
        return Evaluation(spread * rng.standard_t(2, size=(2, 200)), level(beta) + 0.1 * rng.normal(size=(2, 200)))

    return fit_at, evaluate, fitted


@pytest.mark.parametrize("rising", [True, False])
def test_no_refit_beyond_a_rise_from_the_best_value(rising):
    """On a stand-in engine whose reweighting is exact (k-hat small) except to beta = 0.1, 0.9 and
    1.0 (k-hat far above 0.7), with a Monte Carlo error of about 0.007 on the criterion. From the
    pilot at 0.5, 0.1 is below the best value and is fitted. If the criterion is 100 (beta - 0.3)^2,
    it rises from 0.3 (best) to 0.8 by 25, thousands of standard errors: 0.9 and 1.0 cannot be the
    best, are left out (NaN) and get no fit, and the best, 0.3, is confirmed. If it is -10 beta,
    nothing rises above the best, and 0.9 and 1.0 are fitted (then 1.0, the best, is confirmed)."""
    grid = [rs.BetaD(b / 10) for b in range(1, 11)]
    fit_at, evaluate, fitted = _stand_in(1, (0.1, 0.9, 1.0), (lambda beta: 100 * (beta - 0.3) ** 2) if rising
                                         else (lambda beta: -10 * beta))
    points, _fits = walk_grid(grid, 4, fit_at, evaluate)
    criteria = np.array([p.criterion for p in points])
    if rising:
        assert fitted == [0.5, 0.1, 0.3]
        assert np.isnan(criteria[8:]).all() and all(p.pareto_k > 0.7 for p in points[8:])
        assert points[9].source.startswith("not evaluated: k-hat") and "rises from the best value so far, " \
            "BetaD(0.3)" in points[9].source
        assert np.nanargmin(criteria) == 2 and points[2].source.startswith("fit of its own")
    else:
        assert fitted == [0.5, 0.1, 0.9, 1.0, 1.0] and np.isfinite(criteria).all()


def test_a_value_left_out_is_fitted_when_the_final_points_show_no_rise():
    """A criterion that breaks the rule's premise: 100 (beta - 0.3)^2 up to 0.8, then -50 at 0.9
    and 1.0. Walking out from the pilot at 0.5, 0.8 (k-hat far above 0.7) comes before 0.9 and
    lies beyond a steep rise from 0.3, so it is left out; 0.9 then becomes the best value, above
    0.8, and 0.8 is fitted after all."""
    grid = [rs.BetaD(b / 10) for b in range(1, 11)]
    fit_at, evaluate, fitted = _stand_in(2, (0.8,), lambda beta: 100 * (beta - 0.3) ** 2 if beta < 0.85 else -50.0)
    points, _ = walk_grid(grid, 4, fit_at, evaluate, confirm=False)
    assert fitted == [0.5, 0.8]
    assert points[7].source == "fit" and abs(points[7].criterion - 25.0) < 0.1 and points[7].pareto_k > 0.7


@pytest.mark.parametrize("case, criteria, left_out, expected", [
    ("a rise from the best (0.2) to 0.9, 10 to 50 standard errors a step", [5, 0, 1, 2, 3, 4, 5, 6, 7], set(), 1),
    ("flat within noise: 0.2 standard errors up at 0.9", [5, 0, .01, .005, .01, .02, .01, .015, .02], set(), None),
    ("a fall of 11 standard errors inside the stretch", [5, 0, 1, 2, .5, 4, 5, 6, 7], set(), None),
    ("a value with no criterion inside it", [5, 0, 1, 2, np.nan, 4, 5, 6, 7], set(), None),
    ("the same value left out by this rule", [5, 0, 1, 2, np.nan, 4, 5, 6, 7], {4}, 1),
    ("no value with a criterion", [np.nan] * 9, set(), None),
    ("one value between the best and 1.0", [5, 4, 3, 2, 1, 0.5, 0.2, 0.1, 0], set(), None),
])
def test_a_value_beyond_a_rise_from_the_best_is_recognised(case, criteria, left_out, expected):
    """_best_below_a_rise on hand-made criteria at beta = 0.1..0.9 (standard error 0.1 each; 1.0 is
    the value asked about): it names the best value only past a stretch that rises from it by more
    than 3 combined standard errors and falls nowhere by more than that."""
    points = {j: GridPoint(rs.BetaD((j + 1) / 10), float(c), 0.1, "stand-in") for j, c in enumerate(criteria)}
    positions = np.arange(1, 11) / 10
    assert _best_below_a_rise(points, positions, 9, left_out) == expected, case


@pytest.mark.stan
def test_the_chosen_value_gets_its_own_fit_on_first_use():
    model = rs.location("normal", engine=ENGINE)
    grid = [rs.BetaD(0.25), rs.BetaD(0.3), rs.BetaD(0.35)]
    selection = rs.select_divergence(model, _contaminated(), grid=grid, confirm=False, **SAMPLE)
    if selection.divergence != rs.BetaD(0.3):  # the choice was reweighted: asking for its fit makes one
        assert selection.divergence not in selection.fits
        fit = selection.fit
        assert fit.divergence == selection.divergence and len(selection.fits) == 2
    ax = selection.plot()
    assert ax.get_xlabel().startswith("divergence parameter")


def test_a_warm_start_is_one_draw_and_keeps_every_constraint():
    """A grid value reweighted with too large a k-hat is fitted again, started from the nearest fitted
    value's draw nearest its posterior means (sd units): one draw, so a unit vector stays one and a
    Cholesky factor of a correlation matrix keeps rows of length 1, which their means do not. Quantities
    derived from the parameters (not in ``parameter_names``) are left out."""
    rng = np.random.default_rng(4)
    angle = rng.uniform(0, 2 * np.pi, size=(2, 50))
    u = np.stack([np.cos(angle), np.sin(angle)], axis=-1)
    r = rng.uniform(-0.9, 0.9, size=(2, 50))
    L = np.zeros((2, 50, 2, 2))
    L[..., 0, 0], L[..., 1, 0], L[..., 1, 1] = 1.0, r, np.sqrt(1 - r**2)
    sigma = rng.gamma(2.0, size=(2, 50))
    fit = SimpleNamespace(parameter_names=["u", "L_Omega", "sigma"],
                          posterior={"u": u, "L_Omega": L, "sigma": sigma, "derived": sigma * 2})
    start = _warm_start(fit)
    assert set(start) == {"u", "L_Omega", "sigma"}
    ((chain, iteration),) = np.argwhere(sigma == start["sigma"])
    np.testing.assert_array_equal(start["u"], u[chain, iteration])
    np.testing.assert_array_equal(start["L_Omega"], L[chain, iteration])
    assert np.linalg.norm(start["u"]) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(np.linalg.norm(start["L_Omega"], axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.linalg.norm(u.mean(axis=(0, 1))) < 0.5   # the means would break both constraints
    assert np.linalg.norm(L.mean(axis=(0, 1))[1]) < 0.9
    # the draw nearest the means: here the one of a scalar nearest its mean
    scalar = np.array([[0.0, 1.0, 2.4], [3.0, 4.0, 5.0]])   # mean 2.57
    assert _warm_start(SimpleNamespace(parameter_names=["s"], posterior={"s": scalar}))["s"] == 2.4


@pytest.mark.parametrize("grid, options, match", [
    ([], {}, r"^grid: give a non-empty list"),
    ([0.1, -0.2], {}, r"^grid: every value must be"),
    ([rs.BetaD(0.1), rs.GammaD(0.2)], {}, r"^grid: mixes beta and gamma"),
    ([rs.GammaD(0.2, form="original")], {}, r"^grid: the original gamma form"),
    ([0.1, 0.1], {}, r"^grid: repeats a value"),
    ([0.1, 0.2], {"criterion": "aic"}, r"^criterion: must be one of"),
    ([0.1, 0.2], {"fits": "some"}, r"^fits: must be one of"),
    ([0.1, 0.2], {"pilot": 0.5}, r"^pilot: must be a value of the grid"),
    ([0.1, 0.2], {"confirm": "yes"}, r"^confirm: must be True or False"),
])
def test_bad_input(grid, options, match):
    model = rs.location("normal", engine=ENGINE)
    with pytest.raises(rs.RobustStanInputError, match=match):
        rs.select_divergence(model, _contaminated(), grid=grid, **options)


def test_the_hscore_refuses_outcomes_it_does_not_apply_to():
    for model, reason in ((rs.glm("bernoulli", standardize=False, engine=ENGINE), "discrete"),
                          (rs.location("exponential", engine=ENGINE), "does not vanish")):
        with pytest.raises(rs.RobustStanInputError, match=f"^criterion: 'hscore' needs .*{reason}.*'mse' works"):
            rs.select_divergence(model, {"X": np.zeros((4, 1)), "y": np.ones(4)})


@pytest.mark.stan
def test_mse_criterion_against_its_closed_form():
    """y ~ normal(mu, 1) (known sigma) with a tenth of the rows 6 too high. At KL the minimum-loss
    estimate is the mean and its sandwich variance v / N (v = mean((y - ybar)^2)), so KL's MSE
    is v / N + (ybar - mu_pilot)^2 against the final pilot's estimate. The outliers' bias (about
    0.6) dwarfs the variance, so the iterated pilot settles on a robust beta, whose estimate is
    near the clean rows' centre 1."""
    model = rs.location("normal", known={"sigma": 1.0}, standardize=False, engine=ENGINE)
    y = _contaminated(200)["y"]
    selection = rs.select_divergence(model, {"y": y}, grid=[rs.KL(), 0.1, 0.3, 0.5, 0.8], criterion="mse")
    v = np.mean((y - y.mean()) ** 2)
    assert selection.estimates[rs.KL()][0] == pytest.approx(y.mean(), rel=1e-6)
    final_pilot = selection.estimates[selection.divergence][0]
    expected = v / y.size + (y.mean() - final_pilot) ** 2
    assert selection.curve["criterion"].iloc[0] == pytest.approx(expected, rel=1e-5)
    assert selection.divergence != rs.KL() and abs(final_pilot - 1.0) < 0.25
    assert selection.fits == {}  # no NUTS fit until the choice's fit is asked for


@pytest.mark.stan
def test_mse_criterion_works_for_a_discrete_family():
    model = rs.glm("bernoulli", standardize=False, engine=ENGINE)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 2))
    y = (rng.random(300) < 1 / (1 + np.exp(-(X @ np.array([1.5, -1.0]))))).astype(int)
    selection = rs.select_divergence(model, {"X": X, "y": y}, grid=[rs.KL(), 0.2, 0.5], criterion="mse")
    assert np.all(np.isfinite(selection.curve["criterion"])) and np.all(selection.curve["criterion"] > 0)


@pytest.mark.stan
@pytest.mark.statistical_study
def test_mse_criterion_resists_inflated_counts_of_a_poisson_glm():
    """A tenth of the counts raised by 20: KL's coefficients leave those of the same rows unspoiled
    by more than 5 of their posterior sds, while the value the estimated MSE chooses is a beta
    whose coefficients stay within 3 of them (plus 4 Monte Carlo errors of 600 draws)."""
    model = rs.glm("poisson", engine=ENGINE)
    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 2))
    clean = rng.poisson(np.exp(0.5 + X @ np.array([0.4, -0.3])))
    y = clean.copy()
    y[:30] += 20
    selection = rs.select_divergence(model, {"X": X, "y": y}, grid=[rs.KL(), 0.1, 0.3, 0.5, 0.8],
                                     criterion="mse")
    assert selection.divergence != rs.KL()
    assert np.all(np.isfinite(selection.curve["criterion"]))
    options = dict(chains=2, iter_warmup=300, iter_sampling=300, seed=1, show_progress=False)
    b = ["b[1]", "b[2]"]
    reference = model.sample({"X": X, "y": clean}, divergence=rs.KL(), **options).summary().loc[b]
    chosen = model.sample({"X": X, "y": y}, divergence=selection.divergence, **options).summary().loc[b]
    kl = model.sample({"X": X, "y": y}, divergence=rs.KL(), **options).summary().loc[b]
    tolerance = 3 * reference["sd"] + 4 * np.hypot(reference["mcse_mean"], chosen["mcse_mean"])
    assert np.all(np.abs(chosen["mean"] - reference["mean"]) < tolerance), (chosen, reference)
    assert np.max(np.abs(kl["mean"] - reference["mean"]) / reference["sd"]) > 5


@pytest.mark.stan
def test_both_criteria_and_lhw_on_a_custom_model():
    """rs.custom (the normal regression with known sigma of tests/test_variational.py: no new
    compile) with a tenth of the rows 8 too high: the H-score and the estimated MSE both choose a
    beta, not KL; and LHW's w at KL is tr(J I^-1 J) / tr(J) of least squares, J = X'X / N and
    I = sum_i e_i^2 x_i x_i' / N with e the residuals (to 1e-6)."""
    model = rs.custom("normal", data="int<lower=1> P; matrix[N, P] X;", parameters="vector[P] b;",
                      priors="b ~ normal(0, 10);", mu="X[n] * b", sigma="1", engine=ENGINE)
    rng = np.random.default_rng(6)
    n = 150
    X = np.column_stack([np.ones(n), rng.normal(size=n)])
    y = X @ np.array([1.0, 2.0]) + rng.normal(size=n)
    spoiled = y.copy()
    spoiled[: n // 10] += 8.0
    for criterion in ("hscore", "mse"):
        selection = rs.select_divergence(model, {"X": X, "y": spoiled}, grid=[rs.KL(), 0.3, 0.6],
                                         criterion=criterion, fits="full", **SAMPLE)
        assert selection.divergence != rs.KL(), (criterion, selection.curve)
    fit = model.sample({"X": X, "y": y}, divergence=rs.KL(), show_progress=False, **SAMPLE)
    b_hat = np.linalg.lstsq(X, y, rcond=None)[0]
    e = y - X @ b_hat
    J = X.T @ X / n
    I = (X * e[:, None] ** 2).T @ X / n  # noqa: E741  (the sandwich's I and J, as in the paper)
    expected = np.trace(J @ np.linalg.solve(I, J)) / np.trace(J)
    assert rs.calibrate(fit, method="lhw").w == pytest.approx(expected, rel=1e-6)
