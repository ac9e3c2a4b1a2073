"""Command line: `robust-stan demo` and `robust-stan fit`."""

from __future__ import annotations

import argparse
import sys
import warnings

import pandas as pd

from .common.errors import RobustStanInputError, StanCompileError


def _divergence(args):
    from .building.divergences import KL, BetaD, GammaD

    if args.divergence == "kl":
        return KL()
    if args.divergence == "beta":
        return BetaD(args.beta)
    return GammaD(args.gamma, form="original" if args.divergence == "gamma-original" else "decomposable")


def _cmd_demo(args) -> int:
    from .demo import run_demo

    result = run_demo(args.out, seed=args.seed, beta=args.beta, chains=args.chains,
                      iter_warmup=args.iter_warmup, iter_sampling=args.iter_sampling,
                      show_progress=not args.quiet, engine=args.engine)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print("\nLinear regression, N = 200, 10% gross outliers (+10 sd): posterior means and 90% intervals\n")
        print(result["table"].round(3).to_string())
    hits = len(set(result["flagged"]) & set(result["outliers"]))
    print(f"\noutlier_scores(): {hits} of the {len(result['outliers'])} planted outliers are among the "
          f"{len(result['outliers'])} lowest-scored observations")
    print(f"\nWrote to {result['out_dir'].resolve()}:")
    for path in result["paths"].values():
        print(f"  {path.name}")
    return 0


def _cmd_fit(args) -> int:
    from .api.builtin import glm, location

    try:
        frame = pd.read_csv(args.csv)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise RobustStanInputError(f"csv: cannot read {args.csv!r} as a CSV file with a header row ({exc})") from None
    if args.y not in frame.columns:
        raise RobustStanInputError(f"--y: column {args.y!r} is not in {args.csv} (columns: {list(frame.columns)})")
    if not pd.api.types.is_numeric_dtype(frame[args.y]):
        raise RobustStanInputError(f"--y: column {args.y!r} is not numeric")
    data = {"y": frame[args.y].to_numpy()}
    if args.model == "glm":
        columns = args.x.split(",") if args.x else [c for c in frame.columns if c != args.y]
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise RobustStanInputError(f"--x: columns {missing} are not in {args.csv}")
        text = [c for c in columns if not pd.api.types.is_numeric_dtype(frame[c])]
        if text:
            raise RobustStanInputError(f"--x: columns {text} are not numeric; encode them or leave them out with --x")
        data["X"] = frame[columns].to_numpy(dtype=float)
        model = glm(args.family, engine=args.engine)
    else:
        columns = []
        model = location(args.family, engine=args.engine)
    fit = model.sample(data, divergence=_divergence(args), chains=args.chains, iter_warmup=args.iter_warmup,
                       iter_sampling=args.iter_sampling, seed=args.seed, show_progress=not args.quiet)
    summary = fit.summary()
    if columns and args.model == "glm":
        summary.index = [f"b[{c}]" if i.startswith("b[") else i
                         for i, c in zip(summary.index, [None] + columns + [None] * len(summary))]
    print(f"{model.spec.title}; divergence {fit.divergence!r}; {args.chains} chains x {args.iter_sampling} draws")
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(summary.round(3).to_string())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="robust-stan", description="Outlier-robust generalized-Bayes inference for Stan")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--chains", type=int, default=4)
        p.add_argument("--iter-warmup", type=int, default=1000)
        p.add_argument("--iter-sampling", type=int, default=1000)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--engine", default="auto", choices=["auto", "cmdstan", "httpstan"])
        p.add_argument("--quiet", action="store_true", help="no progress bars")

    demo = sub.add_parser("demo", help="regression with 10%% outliers: ordinary vs beta posterior")
    demo.add_argument("--out", default="robust_stan_output", help="output folder (default: ./robust_stan_output)")
    demo.add_argument("--beta", type=float, default=0.3)
    common(demo)
    demo.set_defaults(run=_cmd_demo)

    fit = sub.add_parser("fit", help="fit a built-in model to a CSV file and print the summary")
    fit.add_argument("csv", help="CSV file with a header row")
    fit.add_argument("--y", required=True, help="outcome column")
    fit.add_argument("--x", help="comma-separated predictor columns (glm; default: every other column)")
    fit.add_argument("--model", choices=["glm", "location"], default="glm")
    fit.add_argument("--family", default="normal")
    fit.add_argument("--divergence", choices=["kl", "beta", "gamma", "gamma-original"], default="beta")
    fit.add_argument("--beta", type=float, default=0.3)
    fit.add_argument("--gamma", type=float, default=0.3)
    common(fit)
    fit.set_defaults(run=_cmd_fit)
    return parser


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (RobustStanInputError, StanCompileError) as exc:
        print(f"robust-stan: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

