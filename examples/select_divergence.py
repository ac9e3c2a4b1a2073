"""Choosing beta by the H-score (rs.select_divergence) on a linear regression under three
contamination patterns, reweighted against full fits, and the coefficient error of the choice;
and by the estimated MSE (criterion="mse") on a logistic regression with label flips and a
Poisson regression with inflated counts.

Data: y = 1 + X b + N(0, 1), X ~ N(0, I_3), b = (1, -0.5, 0.25), N rows. Patterns:
``clean``; ``y_outliers``: a tenth of the rows get y + 10; ``leverage``: a tenth of the rows
get x = (4, 4, 4) and y = -10 (high leverage, wrong y). Model: rs.glm("normal") (y
standardised by median and MAD, so beta has the same meaning in every case).

For each pattern: the default 21-point grid (KL, beta = 0.05..1.00) by fits="reweight"
(pilot beta = 0.5) and by fits="full"; the choice, the NUTS fits each ran and their wall
times; the coefficient error ||E[b] - b||_2 at the chosen beta and at beta fixed at 0.1,
0.3, 0.5 and KL (from the full run's fits); on clean data the chosen posterior's sd of b
against KL's. Writes examples/results/select_divergence/{table.csv, curves.csv, curves.png}.

    python examples/select_divergence.py [--rows 200] [--seed 1]

``--replicates K`` chooses (fits="reweight" or the estimated MSE) and scores every case on K
data sets (seeds 1..K, the data of seed 1 being the main run's), without the full grid, to
show how one data set's error ratio sits among others: writes replicates_n<rows>.csv and
prints each case's choices and ratio distribution.

    python examples/select_divergence.py --replicates 50
    python examples/select_divergence.py --replicates 10 --rows 2000 --cases logistic_flips poisson_inflated
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

import robust_stan as rs
from robust_stan.methods.selection.divergence import grid_value

OUT = Path(__file__).parent / "results" / "select_divergence"
TRUE_B = np.array([1.0, -0.5, 0.25])
SAMPLE = dict(chains=4, iter_warmup=500, iter_sampling=1000)
FIXED = {"KL": rs.KL(), "beta 0.1": rs.BetaD(0.1), "beta 0.3": rs.BetaD(0.3), "beta 0.5": rs.BetaD(0.5)}


def simulate(pattern: str, n: int, rng: np.random.Generator) -> dict:
    X = rng.normal(size=(n, 3))
    y = 1.0 + X @ TRUE_B + rng.normal(size=n)
    bad = np.arange(n // 10)
    if pattern == "y_outliers":
        y[bad] += 10.0
    elif pattern == "leverage":
        X[bad] = 4.0
        y[bad] = -10.0
    return {"X": X, "y": y}


def coefficient_error(fit, true_b: np.ndarray = TRUE_B) -> float:
    return float(np.linalg.norm(fit.posterior["b"].mean(axis=(0, 1)) - true_b))


# discrete outcomes, where the H-score does not apply: beta chosen by criterion="mse"
DISCRETE = {"logistic_flips": ("bernoulli", np.array([1.5, -1.0])),
            "poisson_inflated": ("poisson", np.array([0.4, -0.3]))}
LOGISTIC_INTERCEPT = 0.3


def simulate_discrete(case: str, n: int, rng: np.random.Generator) -> dict:
    """``logistic_flips``: y ~ Bernoulli(logit^-1(0.3 + X b)), X ~ N(0, I_2), and the labels of a
    tenth of the rows, chosen at random, flipped. ``poisson_inflated``: y ~ Poisson(exp(0.5 + X b)),
    and a tenth of the rows get y + 20."""
    family, true_b = DISCRETE[case]
    X = rng.normal(size=(n, true_b.size))
    if family == "bernoulli":
        y = rng.binomial(1, 1 / (1 + np.exp(-(LOGISTIC_INTERCEPT + X @ true_b))))
        flipped = rng.choice(n, n // 10, replace=False)
        y[flipped] = 1 - y[flipped]
    else:
        y = rng.poisson(np.exp(0.5 + X @ true_b))
        y[: n // 10] += 20
    return {"X": X, "y": y}


def discrete_data(case: str, rows: int, seed: int) -> dict:
    """The data set of ``seed`` for a discrete case, as every script that scores the case draws it."""
    return simulate_discrete(case, rows, np.random.default_rng([seed, 10 + list(DISCRETE).index(case)]))


def discrete_case(case: str, rows: int, seed: int) -> tuple[dict, object]:
    """A discrete case on the data set of ``seed``: beta chosen by the estimated MSE, and the coefficient
    error of the choice against KL and beta fixed at 0.1, 0.3 and 0.5 (the table's row, and the Selection)."""
    family, true_b = DISCRETE[case]
    data = discrete_data(case, rows, seed)
    model = rs.glm(family)
    start = time.perf_counter()
    selection = rs.select_divergence(model, data, criterion="mse", seed=seed, **SAMPLE)
    seconds = time.perf_counter() - start
    fixed = {name: model.sample(data, divergence=d, seed=seed, show_progress=False, **SAMPLE) for name, d in FIXED.items()}
    errors = {name: coefficient_error(fit, true_b) for name, fit in fixed.items()}
    row = {"pattern": case, "criterion": "mse", "chosen (reweight)": repr(selection.divergence),
           "fits (reweight)": 0, "seconds (reweight)": round(seconds, 1),
           "error (chosen)": coefficient_error(selection.fit, true_b),
           **{f"error ({name})": value for name, value in errors.items()}}
    row["error ratio to best fixed"] = row["error (chosen)"] / min(errors.values())
    return row, selection


PATTERNS = ("clean", "y_outliers", "leverage")


def continuous_case(pattern: str, rows: int, seed: int) -> dict:
    """A linear-regression pattern on the data set of ``seed``: beta chosen by the H-score with
    fits="reweight", and the coefficient error of the choice against KL and beta fixed at 0.1, 0.3 and
    0.5, each fitted with its chains started in its posterior's largest mode."""
    data = simulate(pattern, rows, np.random.default_rng([seed, PATTERNS.index(pattern)]))
    model = rs.glm("normal")
    selection = rs.select_divergence(model, data, fits="reweight", seed=seed, **SAMPLE)
    errors = {name: coefficient_error(model.sample(data, divergence=d, seed=seed, inits="mode",
                                                   show_progress=False, **SAMPLE))
              for name, d in FIXED.items()}
    row = {"pattern": pattern, "criterion": "hscore", "chosen (reweight)": repr(selection.divergence),
           "fits (reweight)": len(selection.fits), "error (chosen)": coefficient_error(selection.fit),
           **{f"error ({name})": value for name, value in errors.items()}}
    row["error ratio to best fixed"] = row["error (chosen)"] / min(errors.values())
    return row


def replicate_cases(replicates: int, rows: int, cases: list[str]) -> None:
    """``cases`` on data sets of seeds 1..``replicates``: replicates_n<rows>.csv and a summary."""
    seeds = range(1, replicates + 1)
    table = pd.DataFrame([{**continuous_case(case, rows, seed), "seed": seed, "rows": rows}
                          for case in PATTERNS if case in cases for seed in seeds]
                         + [{**discrete_case(case, rows, seed)[0], "seed": seed, "rows": rows}
                            for case in DISCRETE if case in cases for seed in seeds])
    table.to_csv(OUT / f"replicates_n{rows}.csv", index=False)
    for case, sub in table.groupby("pattern", sort=False):
        ratio = sub["error ratio to best fixed"]
        print(f"{case} (N = {rows}, {len(sub)} data sets): chosen {sub['chosen (reweight)'].value_counts().to_dict()}; "
              f"error ratio to best fixed: median {ratio.median():.2f}, mean {ratio.mean():.2f}, "
              f"above 1.5 in {(ratio > 1.5).mean():.0%}; mean errors "
              f"{sub.filter(like='error (').mean().round(3).to_dict()}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replicates", type=int, default=0,
                        help="instead of the full-grid comparison: choose and score --cases on this many data sets")
    parser.add_argument("--cases", nargs="+", choices=[*PATTERNS, *DISCRETE], default=[*PATTERNS, *DISCRETE])
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.replicates:
        replicate_cases(args.replicates, args.rows, args.cases)
        return
    model = rs.glm("normal")
    model.compile()
    rows, curves = [], []
    for k, pattern in enumerate(PATTERNS):
        data = simulate(pattern, args.rows, np.random.default_rng([args.seed, k]))
        runs = {}
        for fits in ("reweight", "full"):
            start = time.perf_counter()
            selection = rs.select_divergence(model, data, fits=fits, seed=args.seed, **SAMPLE)
            runs[fits] = (selection, time.perf_counter() - start)
            curves.append(selection.curve.assign(pattern=pattern, fits=fits))
        (reweighted, t_reweight), (full, t_full) = runs["reweight"], runs["full"]
        by_name = {repr(d): fit for d, fit in full.fits.items()}
        errors = {name: coefficient_error(by_name[repr(d)]) for name, d in FIXED.items()}
        chosen_fit = by_name[repr(reweighted.divergence)]
        row = {"pattern": pattern, "chosen (reweight)": repr(reweighted.divergence),
               "chosen (full)": repr(full.divergence), "fits (reweight)": len(reweighted.fits),
               "fits (full)": len(full.fits), "seconds (reweight)": round(t_reweight, 1),
               "seconds (full)": round(t_full, 1), "time ratio": round(t_reweight / t_full, 3),
               "grid steps apart": round(abs(grid_value(reweighted.divergence) - grid_value(full.divergence)) / 0.05),
               "error (chosen)": coefficient_error(chosen_fit),
               **{f"error ({name})": value for name, value in errors.items()},
               "sd of b, chosen / KL": float(chosen_fit.posterior["b"].std(axis=(0, 1)).mean()
                                             / by_name["KL()"].posterior["b"].std(axis=(0, 1)).mean())}
        best_fixed = min(errors.values())
        row["error ratio to best fixed"] = row["error (chosen)"] / best_fixed
        rows.append(row)
        print(pd.Series(row).to_string(), flush=True)
    for case in DISCRETE:
        row, selection = discrete_case(case, args.rows, args.seed)
        curves.append(selection.curve.assign(pattern=case, fits="mse"))
        rows.append(row)
        print(pd.Series(row).to_string(), flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(OUT / "table.csv", index=False)
    curve_table = pd.concat(curves)
    curve_table.to_csv(OUT / "curves.csv", index=False)
    plot(curve_table, table)


def plot(curves: pd.DataFrame, table: pd.DataFrame) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    patterns = list(table["pattern"])
    fig, axes = plt.subplots(1, len(patterns), figsize=(4.0 * len(patterns), 3.4))
    for ax, pattern in zip(axes, patterns):
        for fits, style in (("full", "-"), ("reweight", "--"), ("mse", "-")):
            sub = curves[(curves.pattern == pattern) & (curves.fits == fits)]
            if len(sub):
                ax.errorbar(sub["value"], sub["criterion"], yerr=2 * sub["mcse"].fillna(0), linestyle=style,
                            capsize=2, label=f"fits={fits}" if fits != "mse" else "estimated MSE")
        chosen = table.loc[table.pattern == pattern, "chosen (reweight)"].iloc[0]
        ax.set_title(f"{pattern}\nchosen: {chosen}", fontsize=9)
        ax.set_xlabel("beta (0: KL)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("H-score (posterior mean)")
    axes[len(patterns) - len(DISCRETE)].set_ylabel("estimated MSE")
    fig.tight_layout()
    fig.savefig(OUT / "curves.png", dpi=120)


if __name__ == "__main__":
    main()
