"""Coverage of 90% credible intervals with and without rs.calibrate, over repeated data sets
(issue 24's coverage study, on the five cases of examples/select_divergence.py).

Each case uses the divergence chosen for it in examples/results/select_divergence/table.csv (run
that example first): the H-score's choice for the three linear regressions, the estimated MSE's
for the logistic regression with label flips and the Poisson regression with inflated counts.
For each of R data sets (fresh draws of the same design and contamination): NUTS at learning
rate w = 1 (each chain started in the posterior's largest mode: model.sample(inits="mode");
--inits dispersed for Stan's own starts), then rs.calibrate by "lhw" (NUTS again at LHW's w)
and by "sandwich" (the same draws, adjusted); each coefficient's central 90% interval is
checked against the clean-data truth b. Coverage is the share of (data set, coefficient) pairs
covered, with its standard error over data sets. ("bootstrap" is left out: it runs about 100
NUTS fits per data set.) runs.csv keeps each interval's ends (``<method>_b<j>_low`` and ``_high``).

rs.calibrate calibrates towards the minimiser of the chosen loss's expectation, which is the
clean-data b only where the loss is robust to the contamination. For label flips it is not (no beta
removes their attenuation, examples/label_flips_divergences.py), so on that case the coverage of the
loss's population minimiser (label_flips_divergences: minimiser on population_sample) is scored beside the
coverage of b (``<method>_covered_minimiser``, table columns ``... minimiser``).

    python examples/calibration_coverage.py [--repeats 100] [--rows 200] [--workers 2] [--cases ...]
        [--inits dispersed] [--choose per-data-set --out calibration_coverage_per_data_set]

Writes examples/results/calibration_coverage/ (or --out) {runs.csv, table.csv, coverage.png}. With --choose
per-data-set, rs.select_divergence chooses the divergence on every data set (the workflow a user runs:
choose, then calibrate) instead of one choice per case for all of them.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import robust_stan as rs
from _cluster import add_address_argument, cluster_pool

sys.path.insert(0, str(Path(__file__).parent))
from select_divergence import DISCRETE, OUT as SELECTION_OUT, TRUE_B, simulate, simulate_discrete

OUT = Path(__file__).parent / "results" / "calibration_coverage"
MINIMISER_X_ROWS = 400_000  # as label_flips_population.csv
LINEAR = ("clean", "y_outliers", "leverage")
SAMPLE = dict(chains=4, iter_warmup=500, iter_sampling=1000)
METHODS = ("w=1", "lhw", "sandwich")


def chosen_divergences() -> dict[str, rs.Divergence]:
    """The divergence examples/select_divergence.py chose for each case."""
    table = pd.read_csv(SELECTION_OUT / "table.csv")
    out = {}
    for case, text in zip(table["pattern"], table["chosen (reweight)"]):
        match = re.fullmatch(r"BetaD\(([0-9.e-]+)\)", text)
        out[case] = rs.BetaD(float(match.group(1))) if match else rs.KL()
    return out


def case_setting(case: str) -> tuple[str, np.ndarray]:
    """(family, true coefficients) of a case."""
    return ("normal", TRUE_B) if case in LINEAR else DISCRETE[case]


def interval_ends(fit, coefficients: int) -> tuple[np.ndarray, np.ndarray]:
    """Each coefficient's central 90% interval (lower ends, upper ends)."""
    b = fit.posterior["b"].reshape(-1, coefficients)
    low, high = np.quantile(b, [0.05, 0.95], axis=0)
    return low, high


def share_held(low: np.ndarray, high: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The share of coefficients (last axis) whose interval [low, high] holds ``target``."""
    return ((low <= target) & (target <= high)).mean(axis=-1)


def coverage_of(runs: pd.DataFrame, name: str, target: np.ndarray) -> np.ndarray:
    """Per data set (row of runs.csv), the share of coefficients whose interval by ``name`` holds ``target``."""
    ends = [runs[[f"{name}_b{j + 1}_{end}" for j in range(target.size)]].to_numpy() for end in ("low", "high")]
    return share_held(*ends, target)


def loss_minimiser(case: str, divergence: str) -> np.ndarray | None:
    """The coefficients minimising the expected loss of ``divergence`` (its repr) on ``case``'s contaminated
    population, where the example computes it: label flips, KL or beta (label_flips_divergences)."""
    match = re.fullmatch(r"BetaD\(([0-9.e-]+)\)", divergence)
    if case != "logistic_flips" or not (match or divergence == "KL()"):
        return None
    from label_flips_divergences import minimiser, population_sample

    kind, value = ("beta", float(match.group(1))) if match else ("KL", 0.0)
    return minimiser(*population_sample(MINIMISER_X_ROWS), kind, value)[1:]


def one_data_set(case: str, divergence, repeat: int, rows: int, inits: str | None = "mode") -> dict:
    """Coverage on data set ``repeat`` of ``case`` at ``divergence`` (its fit started by ``inits``:
    "mode", the chains in the largest mode; None, Stan's dispersed starts); None: the divergence
    rs.select_divergence chooses on this data set (the H-score for the linear regressions, the
    estimated MSE for the discrete cases), and the chosen value's fit."""
    warnings.simplefilter("ignore")
    family, true_b = case_setting(case)
    rng = np.random.default_rng([repeat, 7, (list(LINEAR) + list(DISCRETE)).index(case)])
    data = simulate(case, rows, rng) if case in LINEAR else simulate_discrete(case, rows, rng)
    model = rs.glm(family)
    if divergence is None:
        criterion = "hscore" if case in LINEAR else "mse"
        selection = rs.select_divergence(model, data, criterion=criterion, seed=repeat + 1, **SAMPLE)
        divergence, fit = selection.divergence, selection.fit
    else:
        fit = model.sample(data, divergence=divergence, seed=repeat + 1, inits=inits, show_progress=False, **SAMPLE)
    lhw = rs.calibrate(fit, method="lhw")
    sandwich = rs.calibrate(fit, method="sandwich")
    row = {"case": case, "repeat": repeat, "divergence": repr(divergence), "lhw_w": lhw.w}
    for name, f in zip(METHODS, (fit, lhw, sandwich)):
        low, high = interval_ends(f, true_b.size)
        row[f"{name}_covered"] = float(share_held(low, high, true_b))
        row |= {f"{name}_b{j + 1}_{end}": value[j] for j in range(true_b.size)
                for end, value in (("low", low), ("high", high))}
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--choose", choices=("fixed", "per-data-set"), default="fixed",
                        help="fixed: each case's divergence from examples/select_divergence.py's table; per-data-set: "
                             "rs.select_divergence on every data set")
    parser.add_argument("--inits", choices=("mode", "dispersed"), default="mode",
                        help="fixed: start each fit's chains in the largest mode (model.sample(inits='mode')) or "
                             "from Stan's dispersed starts")
    parser.add_argument("--cases", nargs="+", default=None, help="only these cases (default: all five)")
    parser.add_argument("--out", default=None, help="folder under examples/results (default calibration_coverage)")
    add_address_argument(parser)
    args = parser.parse_args(argv)
    out = OUT.parent / args.out if args.out else OUT
    out.mkdir(parents=True, exist_ok=True)
    divergences = chosen_divergences()
    if args.cases:
        divergences = {case: divergences[case] for case in args.cases}
    if args.choose == "per-data-set":
        divergences = dict.fromkeys(divergences)
    for family in {case_setting(case)[0] for case in divergences}:
        rs.glm(family).compile()
    start = time.perf_counter()
    tasks = [(case, r) for case in divergences for r in range(args.repeats)]
    with cluster_pool(args.workers, args.address) as pool:
        inits = "mode" if args.inits == "mode" else None
        futures = [pool.submit(one_data_set, case, divergences[case], r, args.rows, inits) for case, r in tasks]
        runs = []
        for i, future in enumerate(futures):
            runs.append(future.result())
            if (i + 1) % 50 == 0:
                print(f"{i + 1}/{len(tasks)} data sets, {time.perf_counter() - start:.0f} s", flush=True)
    runs = pd.DataFrame(runs)
    for name in METHODS:
        runs[f"{name}_covered_minimiser"] = np.nan
    for (case, divergence), index in runs.groupby(["case", "divergence"]).groups.items():
        target = loss_minimiser(case, divergence)
        for name in METHODS if target is not None else ():
            runs.loc[index, f"{name}_covered_minimiser"] = coverage_of(runs.loc[index], name, target)
    runs.to_csv(out / "runs.csv", index=False)
    rows = []
    for case, group in runs.groupby("case", sort=False):
        choices = group["divergence"].value_counts()
        divergence = (repr(divergences[case]) if divergences[case] is not None else
                      f"per data set (mostly {choices.index[0]}, {choices.iloc[0]} of {len(group)})")
        row = {"case": case, "divergence": divergence, "data sets": len(group),
               "median lhw w": float(group["lhw_w"].median())}
        for target, suffix in (("", ""), (" minimiser", "_minimiser")):
            for name in METHODS:
                values = group[f"{name}_covered{suffix}"]
                if values.notna().all():
                    row[f"coverage {name}{target}"] = float(values.mean())
                    row[f"se {name}{target}"] = float(values.std(ddof=1) / np.sqrt(len(values)))
        rows.append(row)
    table = pd.DataFrame(rows)
    table.to_csv(out / "table.csv", index=False)
    print(table.to_string(index=False))
    print(f"{time.perf_counter() - start:.0f} s")
    plot(table, out)


def plot(table: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    x = np.arange(len(table))
    for k, name in enumerate(METHODS):
        ax.errorbar(x + (k - 1) * 0.2, table[f"coverage {name}"], yerr=2 * table[f"se {name}"], fmt="o",
                    capsize=3, label=name)
    ax.axhspan(0.85, 0.95, color="0.9", zorder=0, label="target 85-95%")
    ax.axhline(0.9, color="0.5", linewidth=0.8)
    ax.set_xticks(x, [f"{c}\n{d}" for c, d in zip(table["case"], table["divergence"])], fontsize=8)
    ax.set_ylabel("coverage of 90% intervals")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out / "coverage.png", dpi=120)


if __name__ == "__main__":
    main()
