"""Embarrassingly parallel work on rs.Cluster: a 16-point beta grid with fits="full" (one NUTS fit
per grid value, each a task) run here, on a 1-worker and on a 2-worker LocalCluster.

The problem is issue 20's: a normal linear regression, N = 2000 rows, P = 10, a tenth of the
rows gross outliers. Each fit runs one chain (1000 warm-up + 1000 draws), so that a task uses
one core: a fit of k chains runs them in k processes of its own, and on a 2-core machine two
workers with 2 chains each would only compete. Prints, from one run:

- the 2-worker speed-up over 1 worker (target at least 1.7);
- the scheduling overhead per task: (1-worker wall time - the serial run's) / tasks, as a share
  of the mean task time (target under 5%);
- that the three runs give identical criteria.

    python benchmarks/cluster_scaling.py [--grid 16] [--workers 2]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import robust_stan as rs


def problem(n: int = 2000, p: int = 10, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = 1.0 + X @ rng.normal(0, 1, p) + rng.normal(size=n)
    y[: n // 10] += 10.0
    return {"X": X, "y": y}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=int, default=16, help="grid values (beta = 0.05, 0.10, ...)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", rs.RobustStanWarning)  # one chain: no R-hat across chains
    model = rs.glm("normal")
    model.compile()
    data = problem()
    grid = [rs.BetaD(round(0.05 * (k + 1), 2)) for k in range(args.grid)]
    options = dict(chains=1, iter_warmup=1000, iter_sampling=1000, seed=7)

    def run(cluster):
        start = time.perf_counter()
        selection = rs.select_divergence(model, data, grid=grid, fits="full", cluster=cluster, **options)
        chains = sum(fit.raw.seconds["total"] for fit in selection.fits.values())  # NUTS itself, where it ran
        return time.perf_counter() - start, chains, selection.curve["criterion"].to_numpy()

    serial, serial_chains, serial_curve = run(None)
    task = serial / args.grid
    print(f"{args.grid} fits (one chain each), normal glm N = 2000, P = 10\n")
    print(f"serial, in this process: {serial:.1f} s ({task:.2f} s a fit, of which NUTS {serial_chains / args.grid:.2f} s)")
    walls, chains = {}, {}
    for workers in (1, args.workers):
        with rs.Cluster(workers=workers, show_progress=False) as cluster:
            run(cluster)  # a first pass: the workers import robust-stan and load the build
            walls[workers], chains[workers], curve = run(cluster)
            if workers == 1:
                # Dask's own cost of a task: tasks that only wait as long as a fit takes
                start = time.perf_counter()
                cluster.map(time.sleep, [task] * args.grid)
                scheduling = (time.perf_counter() - start) / args.grid - task
        same = np.array_equal(curve, serial_curve)
        print(f"{workers} worker(s): {walls[workers]:.1f} s (NUTS {chains[workers] / args.grid:.2f} s a fit); "
              f"criteria identical to the serial run: {same}")
    speedup = walls[1] / walls[args.workers]
    overhead = (walls[1] - serial) / args.grid
    print(f"\nRATIO {args.workers} workers / 1 worker speed-up = {speedup:.2f}  (target >= 1.7: "
          f"{'met' if speedup >= 1.7 else 'MISSED'})")
    print(f"RATIO Dask's scheduling overhead per task = {scheduling * 1e3:.0f} ms = {scheduling / task:.1%} of a "
          f"task  (target < 5%: {'met' if scheduling / task < 0.05 else 'MISSED'})")
    print(f"RATIO a fit on a 1-worker cluster against the serial run: {overhead * 1e3:.0f} ms more = "
          f"{overhead / task:.1%} of a task; NUTS itself runs {chains[1] / serial_chains:.2f} x as long in the worker")


if __name__ == "__main__":
    main()
