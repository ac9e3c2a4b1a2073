"""Memory of a NUTS fit before and after its per-observation quantities are asked for.

A normal glm on N = 100,000 rows, 4 chains x 1000 draws: the fit should hold the
parameters only (a few MB) until ``fit.log_lik`` is read; then log_lik,
robust_loss and y_rep (3 x 4000 x N doubles, 9.6 GB at N = 100,000) are computed
in one engine call per chain. ``--rows`` and ``--draws`` shrink the problem; the
second half (computing the quantities) runs only with ``--compute``, since at
the full size it needs that much memory.

    python benchmarks/pointwise_memory.py [--rows 100000] [--draws 1000] [--compute]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import robust_stan as rs


def array_bytes(obj) -> int:
    """Bytes held by the NumPy arrays reachable from a fit's draws (variables, sampler stats, kept quantities)."""
    arrays = list(obj.raw.variables.values()) + list(obj.raw.sampler.values()) + list(obj.posterior.values())
    arrays += list((obj._pointwise or {}).values())
    return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--compute", action="store_true", help="then read fit.log_lik and report again")
    args = parser.parse_args()

    rng = np.random.default_rng(1)
    X = rng.normal(size=(args.rows, 3))
    y = 1 + X @ [1.0, -0.5, 0.25] + rng.normal(size=args.rows)
    model = rs.glm("normal")
    start = time.perf_counter()
    fit = model.sample({"X": X, "y": y}, rs.BetaD(0.3), chains=4, iter_warmup=args.draws, iter_sampling=args.draws,
                       seed=1, show_progress=False)
    print(f"N = {args.rows}, 4 x {args.draws} draws: sampled in {time.perf_counter() - start:.1f} s; the fit holds "
          f"{array_bytes(fit) / 1e6:.1f} MB of arrays (per-observation arrays held: "
          f"{sorted(k for k, v in fit.raw.variables.items() if v.size and v.shape[2:] == (args.rows,))})")
    if args.compute:
        start = time.perf_counter()
        _ = fit.log_lik  # reading the property computes the array
        print(f"after reading fit.log_lik ({time.perf_counter() - start:.1f} s): {array_bytes(fit) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
