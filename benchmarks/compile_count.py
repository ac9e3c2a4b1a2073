"""Real compiles needed to fit one glm under every divergence and with weights: should be exactly 1.

Runs in a FRESH, temporary httpstan cache (XDG_CACHE_HOME points at a new
temporary folder, set before httpstan is imported; the shared cache is not
touched), fits one normal glm under KL, BetaD at three values, GammaD (both
forms) and KL/BetaD with a weight vector, with short chains, and counts the
real builds with ``robust_stan.engines.COMPILE_COUNTS``. A second Python
process on the same temporary cache then fits again and must build nothing.

This is a benchmark, not a test: it prints what it measured in one run.

    python benchmarks/compile_count.py [--n 200] [--k 3] [--iter 100]
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--child" not in sys.argv and "ROBUST_STAN_BENCH_CACHE" not in os.environ:
    import tempfile

    os.environ["ROBUST_STAN_BENCH_CACHE"] = tempfile.mkdtemp(prefix="robust_stan_compile_count_")
if "ROBUST_STAN_BENCH_CACHE" in os.environ:
    # Must happen before httpstan (and robust_stan, which imports it lazily) is imported.
    os.environ["XDG_CACHE_HOME"] = os.environ["ROBUST_STAN_BENCH_CACHE"]

import argparse
import shutil
import subprocess
import time

import numpy as np


def simulate(n: int, k: int, seed: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k))
    y = 0.5 + X @ rng.normal(0, 0.5, size=k) + rng.normal(size=n)
    y[: n // 10] += 8.0  # a few outliers, so the robust fits have something to do
    return {"X": X, "y": y}


def fits(args) -> list[tuple[str, dict]]:
    import robust_stan as rs

    weights = np.random.default_rng(4).uniform(0.5, 1.5, size=args.n)
    return [
        ("KL", {"divergence": rs.KL()}),
        ("BetaD(0.1)", {"divergence": rs.BetaD(0.1)}),
        ("BetaD(0.3)", {"divergence": rs.BetaD(0.3)}),
        ("BetaD(0.5)", {"divergence": rs.BetaD(0.5)}),
        ("GammaD(0.3)", {"divergence": rs.GammaD(0.3)}),
        ("GammaD(0.3, original)", {"divergence": rs.GammaD(0.3, form="original")}),
        ("KL + weights", {"divergence": rs.KL(), "weights": weights}),
        ("BetaD(0.3) + weights", {"divergence": rs.BetaD(0.3), "weights": weights}),
    ]


def run_fits(args, plan) -> list[tuple[str, float, float, int]]:
    import robust_stan as rs
    from robust_stan.engines import COMPILE_COUNTS

    data = simulate(args.n, args.k)
    rows = []
    for label, kwargs in plan:
        # A new Model object per fit: reuse must come from the caches, not from one object.
        model = rs.glm("normal", engine="httpstan")
        start = time.perf_counter()
        fit = model.sample(data, chains=args.chains, iter_warmup=args.iter, iter_sampling=args.iter, seed=1,
                           show_progress=False, **kwargs)
        rows.append((label, time.perf_counter() - start, float(fit.posterior["b"].mean(axis=(0, 1))[0]),
                     COMPILE_COUNTS["httpstan"]))
    return rows


def child(args) -> None:
    """Second process on the same (now warm) temporary cache: one fit, report builds."""
    from robust_stan.engines import COMPILE_COUNTS

    run_fits(args, fits(args)[2:3])
    print(f"CHILD_COMPILES {COMPILE_COUNTS['httpstan']}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="observations (default 200)")
    parser.add_argument("--k", type=int, default=3, help="predictors (default 3)")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--iter", type=int, default=100, help="warmup and sampling iterations each (default 100)")
    parser.add_argument("--keep-cache", action="store_true", help="do not delete the temporary cache")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return

    import httpstan.cache

    from robust_stan.engines import COMPILE_COUNTS

    cache = httpstan.cache.cache_directory()
    temp_root = os.environ["ROBUST_STAN_BENCH_CACHE"]
    assert str(cache).startswith(temp_root), f"httpstan cache {cache} is not the temporary one"
    models_dir = cache / "models"
    before = sorted(p.name for p in models_dir.iterdir()) if models_dir.exists() else []
    print(f"fresh httpstan cache: {cache} (models cached before: {len(before)})")

    rows = run_fits(args, fits(args))
    print(f"\n{'fit':<24}{'seconds':>9}{'mean b[1]':>11}{'compiles so far':>17}")
    for label, seconds, b1, so_far in rows:
        print(f"{label:<24}{seconds:9.1f}{b1:11.3f}{so_far:17d}")
    n_compiles = COMPILE_COUNTS["httpstan"]
    cached = sorted(p.name for p in models_dir.iterdir()) if models_dir.exists() else []
    print(f"\nfits: {len(rows)}; real compiles in this process: {n_compiles}; "
          f"models in the fresh cache: {len(cached)}")

    out = subprocess.run([sys.executable, __file__, "--child", "--n", str(args.n), "--k", str(args.k),
                          "--chains", str(args.chains), "--iter", str(args.iter)],
                         capture_output=True, text=True, env=os.environ.copy())
    child_line = [ln for ln in out.stdout.splitlines() if ln.startswith("CHILD_COMPILES")]
    child_compiles = int(child_line[0].split()[1]) if child_line else None
    if child_compiles is None:
        print(out.stdout, out.stderr, file=sys.stderr)
    print(f"second process, same cache, one more fit: real compiles {child_compiles}")
    print(f"\nRESULT: {len(rows)} fits, {n_compiles} compile(s) (target exactly 1: "
          f"{'met' if n_compiles == 1 else 'MISSED'}); a new process reuses it: "
          f"{'yes' if child_compiles == 0 else 'NO'}")

    if not args.keep_cache:
        shutil.rmtree(temp_root, ignore_errors=True)


if __name__ == "__main__":
    main()
