"""The built-in mislabelling likelihood, rs.glm("bernoulli", mislabel=True), on random label flips.

P(y = 1 | x) = e + (1 - 2 e) logit^-1(alpha + x b), with e the ``flip_rate`` (default prior
uniform(0, 0.5)). Two parts (``--parts``):

- ``coverage``: the label-flip case of examples/select_divergence.py (y ~ Bernoulli(logit^-1(0.3 +
  X b)), X ~ N(0, I_2), b = (1.5, -1), a tenth of the labels flipped at random), the data sets of
  seeds 1..``--datasets`` at N = 200 and 1..``--large-datasets`` at N = 2000, NUTS with 4 chains of
  ``--iter-warmup`` + ``--iter-sampling`` (default 500 + 1000, the settings of
  label_flips_divergences.py's ``flip_model`` part, whose CSV holds the plain glm and the rs.custom
  flip model on the same data sets). Variants: the default (KL, uniform prior),
  the prior flip_rate ~ beta(1, 9) (N = 200), and the default model under beta 0.5 (N = 200, first
  ``--beta-datasets``). Scores: the posterior mean's error, the posterior sd, the share of
  coefficients whose central 90% interval holds b (label_flips_divergences.scores).
- ``table6``: Futami, Sato and Sugiyama's Table 6 setting (KL against KL(epsilon), logistic
  regression, mean-field VI, test accuracy) on spam and EEG eye state, with the contamination of
  examples/robust_vi_classification.py (a fraction of training rows get N(mu_j, 2 sigma_j) noise on
  D/4 random inputs and a flipped label). KL(epsilon) here is the symmetric mislabelling likelihood
  with e learned under its prior (the paper prints p(y = 1) = e + (1 - e) sigma(g) and does not say
  how e is set); the test accuracy uses the clean-label probability logit^-1(alpha + x b).

    python examples/label_flips_mislabel.py [--parts coverage table6] [--datasets 100]
        [--large-datasets 10] [--beta-datasets 50] [--splits 5] [--variants uniform_n200 ...]
        [--first-seed 1] [--first-split 0] [--iter-warmup 500] [--iter-sampling 1000]

Writes examples/results/label_flips_mislabel/coverage_<variant>[_from<first seed>].csv and
table6_runs[_from<first split>].csv; ``summary`` gathers every such file into coverage_summary.csv
and table6.csv.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

import robust_stan as rs
from label_flips_divergences import TRUE_B, scores
from select_divergence import discrete_data

sys.path.insert(0, str(Path(__file__).parent))
from robust_vi_classification import accuracy, prepare

OUT = Path(__file__).parent / "results" / "label_flips_mislabel"
NUTS = dict(chains=4, show_progress=False)  # iter_warmup and iter_sampling: --iter-warmup, --iter-sampling
# Futami's Table 6 rows (KL, KL(epsilon)) for the data sets here
PAPER = {("spam", 0.0): (93.2, 93.4), ("spam", 0.1): (92.9, 93.0), ("spam", 0.2): (92.9, 92.9),
         ("eeg", 0.0): (75.6, 73.4), ("eeg", 0.1): (70.9, 67.7), ("eeg", 0.2): (68.4, 65.5)}
VI = dict(family="meanfield", draws=200, batch_size=200, iter=3000, show_progress=False)


def variants(datasets: int, large_datasets: int, beta_datasets: int, first: int = 1) -> dict:
    """name: (model, priors, divergence, rows, seeds)."""
    return {"uniform_n200": ("mislabel glm (KL, uniform prior)", {}, rs.KL(), 200, range(first, first + datasets)),
            "uniform_n2000": ("mislabel glm (KL, uniform prior)", {}, rs.KL(), 2000,
                              range(first, first + large_datasets)),
            "beta19_n200": ("mislabel glm (KL, beta(1, 9) prior)", {"flip_rate": "beta(1, 9)"}, rs.KL(), 200,
                            range(first, first + datasets)),
            "betad_n200": ("mislabel glm (beta 0.5, uniform prior)", {}, rs.BetaD(0.5), 200,
                           range(first, first + beta_datasets))}


def coverage(name: str, priors: dict, divergence, n: int, seeds, iterations: dict) -> pd.DataFrame:
    model = rs.glm("bernoulli", mislabel=True, priors=priors or None)
    rows = []
    for seed in seeds:
        data = discrete_data("logistic_flips", n, seed)
        start = time.perf_counter()
        fit = model.sample(data, divergence=divergence, seed=seed, **NUTS, **iterations)
        rows.append({"rows": n, "seed": seed, "model": name, "seconds": time.perf_counter() - start,
                     **scores(np.asarray(fit.posterior["b"]).reshape(-1, TRUE_B.size)),
                     "flip_rate (posterior mean)": float(np.mean(fit.posterior["flip_rate"])),
                     "largest R-hat": float(fit.summary()["r_hat"].max())})
        print(pd.Series(rows[-1]).to_string(), flush=True)
    return pd.DataFrame(rows)


def table6(splits) -> pd.DataFrame:
    models = {"KL": rs.glm("bernoulli", standardize=False),
              "KL(epsilon)": rs.glm("bernoulli", mislabel=True, standardize=False)}
    rows = []
    for name in ("spam", "eeg"):
        for contamination in (0.0, 0.1, 0.2):
            for split in splits:
                train, test = prepare(name, contamination, split, "logistic")
                for method, model in models.items():
                    start = time.perf_counter()
                    fitted = model.variational(train, rs.KL(), seed=split, **VI)
                    rows.append({"dataset": name, "contamination": contamination, "split": split, "method": method,
                                 "accuracy": 100 * accuracy(fitted, test["X"], test["y"]),
                                 "flip_rate (posterior mean)": (float(np.mean(fitted.draws("flip_rate")[0]))
                                                                if method != "KL" else np.nan),
                                 "seconds": time.perf_counter() - start})
                    print(pd.Series(rows[-1]).to_string(), flush=True)
    return pd.DataFrame(rows)


def table6_summary(runs: pd.DataFrame) -> pd.DataFrame:
    grouped = runs.groupby(["dataset", "contamination", "method"], sort=False)
    table = grouped["accuracy"].agg(["mean", "std", "count"]).join(grouped["flip_rate (posterior mean)"].mean())
    table["paper"] = [PAPER[(d, c)][0 if m == "KL" else 1] for d, c, m in table.index]
    return table.round(3)


def coverage_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (rows, model): data sets, the share of 90% intervals holding b with its binomial se over
    the 2 x data sets intervals, and the means of the other scores; beside it, from
    label_flips_divergences.py's flip_model CSV, the plain glm and the rs.custom flip model on the
    same data sets (seeds)."""
    earlier = pd.read_csv(Path(__file__).parent / "results" / "select_divergence" / "label_flips_flip_model.csv")
    earlier = earlier.rename(columns={"e (posterior mean)": "flip_rate (posterior mean)"})
    parts = []
    for (n, model), sub in runs.groupby(["rows", "model"], sort=False):
        same = earlier[(earlier["rows"] == n) & earlier["seed"].isin(sub["seed"])]
        parts += [sub] + [rows.assign(model=f"{name}, same data sets as {model}")
                          for name, rows in same.groupby("model")]
    table = pd.concat(parts).groupby(["rows", "model"], sort=False)
    out = table.mean(numeric_only=True).drop(columns=["seed"])
    out.insert(0, "data sets", table.size())
    share = out["90% intervals holding b"]
    out.insert(2, "se (binomial)", np.sqrt(share * (1 - share) / (2 * out["data sets"])))
    out["fits with R-hat > 1.01"] = table["largest R-hat"].apply(lambda r: int(np.sum(r > 1.01)))
    return out.round(3)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", choices=["coverage", "table6", "summary"],
                        default=["coverage", "table6", "summary"])
    parser.add_argument("--variants", nargs="+", choices=list(variants(0, 0, 0)), default=list(variants(0, 0, 0)),
                        help="the coverage part's runs")
    parser.add_argument("--datasets", type=int, default=100)
    parser.add_argument("--large-datasets", type=int, default=10)
    parser.add_argument("--beta-datasets", type=int, default=50)
    parser.add_argument("--first-seed", type=int, default=1, help="the coverage part's first data set")
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--first-split", type=int, default=0)
    parser.add_argument("--iter-warmup", type=int, default=500)
    parser.add_argument("--iter-sampling", type=int, default=1000)
    args = parser.parse_args(argv)
    iterations = {"iter_warmup": args.iter_warmup, "iter_sampling": args.iter_sampling}
    OUT.mkdir(parents=True, exist_ok=True)
    if "coverage" in args.parts:
        suffix = f"_from{args.first_seed}" if args.first_seed != 1 else ""
        for variant, settings in variants(args.datasets, args.large_datasets, args.beta_datasets,
                                          args.first_seed).items():
            if variant in args.variants:
                table = coverage(*settings, iterations)
                table.to_csv(OUT / f"coverage_{variant}{suffix}.csv", index=False)
                print(table.mean(numeric_only=True).round(3).to_string())
    if "table6" in args.parts:
        suffix = f"_from{args.first_split}" if args.first_split else ""
        table6(range(args.first_split, args.first_split + args.splits)).to_csv(OUT / f"table6_runs{suffix}.csv",
                                                                             index=False)
    if "summary" in args.parts:  # every run written so far
        runs = pd.concat(pd.read_csv(f) for f in sorted(OUT.glob("coverage_*.csv")) if "summary" not in f.name)
        summary = coverage_summary(runs)
        summary.to_csv(OUT / "coverage_summary.csv")
        table = table6_summary(pd.concat(pd.read_csv(f) for f in sorted(OUT.glob("table6_runs*.csv"))))
        table.to_csv(OUT / "table6.csv")
        with pd.option_context("display.width", 250, "display.max_columns", 20):
            print(summary.to_string(), table.to_string(), sep="\n\n")


if __name__ == "__main__":
    main()
