"""Robust mean estimators on their own: clean error rates, breakdown with planted points,
the truncation against brute force, and bad input."""

import itertools

import numpy as np
import pytest
from scipy import optimize, stats

import robust_stan as rs
from robust_stan.methods.rob_ula.estimators import (
    _SAMPLE_ROWS,
    ESTIMATORS,
    EstimateResult,
    geometric_median,
    get_estimator,
    lrv,
    outlier_truncation,
    shortest_interval,
    trimmed_mean,
)

ROBUST = ["lrv", "lrv_once", "coordinate_median", "trimmed_mean", "row_trimmed_mean", "median_of_means",
          "geometric_median"]


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_clean_gaussian_error_rate(name):
    """On N(mu, I_d), n = 2000, d = 20, E||mean - mu|| ~ sqrt(d/n) = 0.1; medians lose at most
    a factor sqrt(pi/2) = 1.25 in efficiency, and lrv / trimmed means drop about a third of the
    rows (sqrt(1/0.64) = 1.25) on top of the Gaussian tails they trim. ||.|| concentrates
    (sd about 0.1 / sqrt(2)/sqrt(d) relative), so 2.5 x sqrt(d/n) is far out of reach of chance."""
    rng = np.random.default_rng(1)
    n, d = 2000, 20
    mu = rng.uniform(-3, 3, d)
    G = rng.normal(mu, 1.0, (n, d))
    result = ESTIMATORS[name](G, 0.1)
    assert isinstance(result, EstimateResult) and result.mean.shape == (d,)
    assert np.linalg.norm(result.mean - mu) < 2.5 * np.sqrt(d / n)


@pytest.mark.parametrize("name", ROBUST)
def test_planted_cluster_does_not_break_robust_estimators(name):
    """20% of rows at mu + 100 e_1: the mean moves by 0.2 * 100 / 0.8... = 25; robust ones
    stay within a constant times epsilon (per-coordinate medians: about 1.25 sd * eps / (1 - eps))."""
    rng = np.random.default_rng(2)
    n_clean, d, eps = 800, 10, 0.2
    mu = rng.normal(size=d)
    clean = rng.normal(mu, 1.0, (n_clean, d))
    bad = np.tile(mu + 100 * np.eye(d)[0], (200, 1))
    G = np.vstack([clean, bad])
    assert np.linalg.norm(G.mean(axis=0) - mu) > 15
    assert np.linalg.norm(ESTIMATORS[name](G, eps).mean - mu) < 1.0


def test_lrv_on_the_papers_mean_estimation_setting():
    """d = 200, 1000 clean rows N(theta, I) and eps = 0.2 of rows N(theta + t, I), t ~ U[0, 10]^d
    per row: the paper's target is lrv's error at most 1/8 of the plain mean's."""
    rng = np.random.default_rng(3)
    d, n_clean, eps = 200, 1000, 0.2
    n_bad = round(eps * n_clean / (1 - eps))
    ratios = []
    for _ in range(3):
        theta = rng.uniform(0, 1, d)
        G = np.vstack([rng.normal(theta, 1.0, (n_clean, d)),
                       theta + rng.uniform(0, 10, (n_bad, d)) + rng.normal(size=(n_bad, d))])
        ratios.append(np.linalg.norm(lrv(G, eps).mean - theta) / np.linalg.norm(G.mean(axis=0) - theta))
    assert max(ratios) < 1 / 8, ratios


def test_lrv_once_is_the_literal_recursion_without_deeper_truncation():
    """With truncation at the top level only, the recursion V + W recombines to the mean of
    the kept rows; check that against the literal recursion run with epsilon 0 below the top."""
    from robust_stan.methods.rob_ula.estimators import _lrv_mean, lrv_once

    rng = np.random.default_rng(7)
    G = np.vstack([rng.normal(size=(300, 9)), rng.normal(8, 1, size=(60, 9))])
    kept = outlier_truncation(G, 0.2)
    no_deeper_truncation, _ = _lrv_mean(G[kept], 0.0)
    result = lrv_once(G, 0.2)
    np.testing.assert_allclose(result.mean, no_deeper_truncation, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.mean, G[kept].mean(axis=0), rtol=1e-12, atol=1e-12)
    assert result.kept_fraction == pytest.approx(kept.mean())
    assert not np.allclose(result.mean, lrv(G, 0.2).mean)  # the literal version truncates again


@pytest.mark.parametrize("n, d, epsilon, ties", [(300, 4, 0.1, False), (301, 1, 0.2, False), (57, 30, 0.05, False),
                                                  (10, 3, 0.3, False), (200, 3, 0.1, True)])
def test_row_trimmed_mean_drops_the_rows_farthest_from_the_median(n, d, epsilon, ties):
    """Against a row-by-row reference: the coordinate-wise median, each row's squared distance
    to it summed term by term, the rows in order of distance (ties in row order) and the first
    n - floor(epsilon n) kept. ``ties``: small integers, so many rows share the distance at the cut."""
    from robust_stan.methods.rob_ula.estimators import row_trimmed_mean

    rng = np.random.default_rng(n + d)
    G = rng.integers(-2, 3, size=(n, d)).astype(float) if ties else rng.standard_t(3, size=(n, d))
    centre = [sorted(G[:, j])[n // 2] if n % 2 else sum(sorted(G[:, j])[n // 2 - 1:n // 2 + 1]) / 2
              for j in range(d)]
    distance = [sum((G[i, j] - centre[j]) ** 2 for j in range(d)) for i in range(n)]
    kept = sorted(sorted(range(n), key=lambda i: distance[i])[: n - int(epsilon * n)])
    result = row_trimmed_mean(G, epsilon)
    np.testing.assert_allclose(result.mean, G[kept].mean(axis=0), rtol=1e-12, atol=1e-12)
    assert result.kept_fraction == len(kept) / n


def test_row_trimmed_mean_is_the_clean_mean_where_the_symmetric_trimmed_mean_is_biased():
    """One-sided far outliers (a tenth of the rows) on a skewed clean distribution (the gradient of
    a normal row's log sigma, 1 - r^2): the rows dropped are exactly the outliers, so the estimate
    is the clean rows' mean to rounding; the coordinate-wise trimmed mean also cuts the clean rows'
    other end, which moves it by far more than the clean mean's standard error (the mechanism
    behind Rob-ULA's bias on a regression, examples/results/rob_ula_bias)."""
    from robust_stan.methods.rob_ula.estimators import row_trimmed_mean

    rng = np.random.default_rng(5)
    residuals = rng.normal(size=(900, 1))
    clean = np.hstack([residuals, 1 - residuals ** 2])
    G = np.vstack([clean, np.column_stack([np.full(100, 12.0), np.full(100, -143.0)]) + rng.normal(size=(100, 2))])
    np.testing.assert_allclose(row_trimmed_mean(G, 0.1).mean, clean.mean(axis=0), rtol=0, atol=1e-12)
    # the symmetric cut keeps the clean rows above their q = 100/900 quantile in the first column
    # and below it in 1 - r^2: population shifts phi(z_q) / (1 - q) and 1 - E[chi2_1 | chi2_1 > c_q]
    q = 100 / 900
    chi2_cut = stats.chi2.ppf(q, 1)
    predicted = [stats.norm.pdf(stats.norm.ppf(q)) / (1 - q),
                 1 - stats.chi2.expect(lambda x: x, args=(1,), lb=chi2_cut, conditional=True)]
    standard_error = clean.std(axis=0) / np.sqrt(800)
    shift = trimmed_mean(G, 0.1).mean - clean.mean(axis=0)
    assert np.all(np.abs(shift - predicted) < 3 * standard_error), (shift, predicted)
    assert np.all(np.abs(predicted) > 2.5 * standard_error)


def _literal_lrv(G, epsilon):
    """Algorithm 2 as written, for reference: every column's shortest interval found on its own,
    the covariance's full eigenbasis split into V (top floor(d/2)) and W, and both parts formed."""
    n, d = G.shape
    keep = max(1, min(n, int(np.ceil((1 - epsilon) ** 2 * n - 1e-9))))
    if keep == n:
        kept = np.ones(n, dtype=bool)
    elif d == 1:
        kept = shortest_interval(G[:, 0], keep)
    else:
        centre = np.array([G[shortest_interval(G[:, j], keep), j].mean() for j in range(d)])
        distances = ((G - centre) ** 2).sum(axis=1)
        kept = np.zeros(n, dtype=bool)
        kept[np.argsort(distances, kind="stable")[:keep]] = True
    X = G[kept]
    if d == 1:
        return X.mean(axis=0)
    _, vectors = np.linalg.eigh(np.cov(X, rowvar=False))
    V, W = vectors[:, d - d // 2:], vectors[:, : d - d // 2]
    return V @ _literal_lrv(X @ V, epsilon) + W @ (W.T @ X.mean(axis=0))


@pytest.mark.parametrize("n,d", [(1250, 200), (2000, 20), (301, 9), (101, 3), (40, 1)])
def test_lrv_equals_the_literal_algorithm(n, d):
    """The fast lrv (one sort for all columns, window sums, W never formed) against the
    algorithm as written, on gross outliers, on values of order 1e6 and on rounded values
    (ties): equal to 1e-10 relative."""
    rng = np.random.default_rng(n + d)
    for scale, rounded in ((1.0, False), (1e6, False), (1.0, True)):
        G = rng.normal(size=(n, d))
        G[: n // 5] += rng.uniform(0, 10, size=(n // 5, d))
        G = np.round(G * 4) / 4 if rounded else G * scale
        expected = _literal_lrv(G, 0.2)
        np.testing.assert_allclose(lrv(G, 0.2).mean, expected, rtol=0, atol=1e-10 * np.abs(expected).max())


def test_shortest_interval_against_brute_force():
    rng = np.random.default_rng(4)
    for _ in range(20):
        x = rng.standard_cauchy(14)
        keep = int(rng.integers(1, 15))
        mask = shortest_interval(x, keep)
        assert mask.sum() == keep
        width = x[mask].max() - x[mask].min()
        best = min(max(c) - min(c) for c in itertools.combinations(x, keep))
        assert width == pytest.approx(best, abs=1e-12)
        # the kept points are exactly those inside their interval
        inside = (x >= x[mask].min()) & (x <= x[mask].max())
        assert inside.sum() == keep


def test_truncation_keeps_the_right_fraction():
    G = np.random.default_rng(5).normal(size=(100, 3))
    assert outlier_truncation(G, 0.2).sum() == 64
    assert outlier_truncation(G, 0.0).all()


def test_truncation_breaks_ties_at_the_cut_by_row_order():
    """280 rows at the origin and 720 at distance 1 on the axes (180 on each half-axis): each
    coordinate has 640 zeros, so the centre is (0, 0); keep = 640 takes the 280 and the first
    360 of the 720 tied rows in row order (a plain argpartition takes others at this size)."""
    axes = np.tile([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]], (180, 1))
    G = np.vstack([axes[:30], np.zeros((280, 2)), axes[30:]])
    kept = outlier_truncation(G, 0.2)
    on_axes = np.flatnonzero(np.abs(G).sum(axis=1) > 0)
    assert kept.sum() == 640 and kept[30:310].all()
    assert np.array_equal(np.flatnonzero(kept[on_axes]), np.arange(360))


def test_lrv_with_no_corruption_is_the_mean():
    G = np.random.default_rng(6).normal(size=(50, 7))
    result = lrv(G, 0.0)
    np.testing.assert_allclose(result.mean, G.mean(axis=0), rtol=1e-12, atol=1e-12)
    assert result.kept_fraction == 1.0


def test_geometric_median_against_direct_minimisation():
    rng = np.random.default_rng(7)
    G = rng.normal(size=(30, 3))
    G[:5] += 20
    found = geometric_median(G).mean
    best = optimize.minimize(lambda y: np.linalg.norm(G - y, axis=1).sum(), G.mean(axis=0),
                             method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000}).x
    np.testing.assert_allclose(found, best, atol=1e-6)
    # the median sits on a data point: five copies of one point among nine rows
    H = np.vstack([np.tile([1.0, 2.0], (5, 1)), rng.normal(size=(4, 2)) * 3])
    np.testing.assert_allclose(geometric_median(H).mean, [1.0, 2.0], atol=1e-8)


def test_get_estimator_by_name_and_by_callable():
    assert get_estimator("lrv") is lrv
    custom = get_estimator(lambda G, eps: G.max(axis=0))
    result = custom(np.array([[1.0, 5.0], [3.0, 2.0]]), 0.1)
    np.testing.assert_array_equal(result.mean, [3.0, 5.0])
    assert result.kept_fraction == 1.0


@pytest.mark.parametrize("G,eps,match", [
    (np.zeros((5, 2)), 0.5, r"^epsilon: must lie in \[0, 0.5\)"),
    (np.zeros((5, 2)), -0.1, r"^epsilon: "),
    (np.array([[0.0, np.nan]]), 0.1, r"^G: contains non-finite"),
    (np.zeros(5), 0.1, r"^G: need a 2-D array"),
])
def test_bad_input(G, eps, match):
    with pytest.raises(rs.RobustStanInputError, match=match):
        lrv(G, eps)
    with pytest.raises(rs.RobustStanInputError, match="^estimator: unknown estimator 'median'"):
        get_estimator("median")


@pytest.mark.parametrize("n, d, epsilon", [(1250, 20, 0.2), (101, 3, 0.1), (7, 2, 0.0), (50, 1, 0.49)])
def test_trimmed_mean_is_scipys_trim_mean(n, d, epsilon):
    """The sort-based trimmed mean keeps the values scipy.stats.trim_mean keeps: equal up to the
    order of summation (1e-12)."""
    from scipy import stats

    G = np.random.default_rng(n).standard_t(3, size=(n, d))
    np.testing.assert_allclose(trimmed_mean(G, epsilon).mean, stats.trim_mean(G, epsilon, axis=0), rtol=1e-12,
                               atol=1e-12)


def _bracket_cases(n: int = 20_000) -> dict[str, np.ndarray]:
    """Columns for the bracketed trimmed mean (n >= BRACKETED_FROM): heavy tails with a shifted
    tenth, heavy ties, sorted both ways, a constant, and two row orders that defeat the evenly
    spaced rows' sample (all sampled values equal; sampled values far narrower than the rest)."""
    rng = np.random.default_rng(5)
    sampled = np.linspace(0, n - 1, _SAMPLE_ROWS).astype(np.intp)
    tails = rng.standard_t(3, size=n) + 30.0 * (rng.uniform(size=n) < 0.1)
    equal_sample = rng.normal(size=n)
    equal_sample[sampled] = 0.0
    narrow_sample = rng.normal(size=n)
    narrow_sample[sampled] = np.linspace(-1e-3, 1e-3, sampled.size)
    return {"tails": tails, "ties": rng.integers(0, 3, size=n).astype(float), "ascending": np.sort(tails),
            "descending": np.sort(tails)[::-1], "constant": np.full(n, 2.5),
            "equal_sample": equal_sample, "narrow_sample": narrow_sample}


@pytest.mark.parametrize("epsilon", [1e-4, 0.1, 0.25, 0.49])
def test_the_bracketed_trimmed_mean_is_scipys_trim_mean(epsilon):
    """From BRACKETED_FROM rows the trimmed mean selects its first and last kept values inside
    brackets from a sample of rows: the same values as scipy.stats.trim_mean (a sort) on every
    kind of column, up to the order of summation (1e-12 of the largest value)."""
    from scipy import stats

    from robust_stan.methods.rob_ula.estimators import BRACKETED_FROM

    cases = _bracket_cases()
    G = np.column_stack(list(cases.values()))
    assert G.shape[0] >= BRACKETED_FROM
    np.testing.assert_allclose(trimmed_mean(G, epsilon).mean, stats.trim_mean(G, epsilon, axis=0), rtol=0,
                               atol=1e-12 * np.abs(G).max())


def test_a_sample_that_misses_the_order_statistics_falls_back_to_the_partition():
    """The adversarial row orders do defeat the brackets (so the test above covers the fallback),
    and the ordinary columns do not (so it covers the bracketed sum)."""
    from robust_stan.methods.rob_ula.estimators import _column_trimmed_mean, _sample_bracket

    cut = 2000
    for name, x in _bracket_cases().items():
        sample = np.sort(x[np.linspace(0, x.size - 1, _SAMPLE_ROWS).astype(np.intp)])[None, :]
        low, high = _sample_bracket(sample, cut, x.size), _sample_bracket(sample, x.size - cut - 1, x.size)
        bracketed = _column_trimmed_mean(x, cut, low[:, 0], high[:, 0])
        assert (bracketed is None) == (name in ("equal_sample", "narrow_sample", "constant")), name


@pytest.mark.parametrize("name", ["trimmed_mean", "row_trimmed_mean", "lrv", "lrv_once", "median_of_means"])
@pytest.mark.parametrize("n, d", [(7, 1), (200, 5), (1500, 3)])
def test_epsilon_zero_is_the_plain_mean(name, n, d):
    """At epsilon = 0 the estimators that take epsilon keep every row (and median_of_means has one
    block), so tune_rob_ula's grid point 0 is plain ULA: the same as the plain mean up to the order
    of summation (1e-12 of the largest value), heavy tails included."""
    G = np.random.default_rng(n + d).standard_t(2, size=(n, d)) * np.logspace(0, 3, d)
    np.testing.assert_allclose(get_estimator(name)(G, 0.0).mean, G.mean(axis=0), rtol=0, atol=1e-12 * np.abs(G).max())
