"""The walk one public call takes through the package's files, counted (issue "One model, one path").

``python -m tools.call_walk`` runs ``rs.rob_ula``, ``rs.dpvi`` and ``rs.select_divergence`` once
each on a small normal regression (compiling its program on first use) and prints, per call:

- stops: the package files of the functions the call runs, in the order each function is first
  called (a function called again, as in a sampler's loop, adds nothing), with repeats of the same
  file in a row merged into one stop;
- files: how many different package files the walk enters;
- climbs: stops whose file is in a higher layer than the stop before (control came back up from a
  lower layer and went on from there);
- re-entries: stops into a lower layer's file that the walk had already entered and then left for a
  higher layer (what "returns to a lower layer's file after leaving it" counts).

Layers are the import-structure test's (common, building, engines, gradients, methods, results,
api; the package root on top). A call is a Python ``call`` event in a file under ``robust_stan/``
(``sys.setprofile``); calls into other libraries are not stops. ``--list`` prints each walk.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import robust_stan as rs

PACKAGE = Path(rs.__file__).resolve().parent
LAYERS = ["common", "building", "engines", "gradients", "methods", "results", "api"]


def layer_of(relative: str) -> int:
    """The layer of a file given relative to the package folder (the package root is on top)."""
    top = relative.split("/")[0]
    return LAYERS.index(top) if top in LAYERS else len(LAYERS)


@dataclass
class Walk:
    """The stops of one call and their counts."""

    stops: list[str]

    @property
    def files(self) -> int:
        return len(set(self.stops))

    @property
    def climbs(self) -> int:
        return sum(layer_of(b) > layer_of(a) for a, b in zip(self.stops, self.stops[1:]))

    @property
    def reentries(self) -> int:
        count, entered, left_upward = 0, set(), set()
        for previous, stop in zip([None] + self.stops, self.stops):
            if previous is not None and layer_of(stop) > layer_of(previous):
                left_upward.update(s for s in entered if layer_of(s) < layer_of(stop))
            if stop in left_upward:
                count += 1
                left_upward.discard(stop)
            entered.add(stop)
        return count


def walk_of(call: Callable[[], object]) -> Walk:
    """Run ``call`` under ``sys.setprofile`` and return the package files its calls entered."""
    stops: list[str] = []
    seen: set = set()

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or code in seen:
            return
        seen.add(code)
        path = Path(code.co_filename)
        if PACKAGE in path.parents:
            relative = path.relative_to(PACKAGE).as_posix()
            if not stops or stops[-1] != relative:
                stops.append(relative)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return Walk(stops)


def regression(n: int = 200, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = 1.0 + X @ np.array([1.0, -0.5]) + rng.normal(size=n)
    y[: n // 20] += 10.0
    return {"X": X, "y": y, "prior_scale_b": np.full(2, 2.5)}  # a data-free prior scale, as DP-VI needs


def calls(model, data) -> dict[str, Callable[[], object]]:
    """One small call of each method the issue names, with a seed."""
    return {
        "rs.rob_ula": lambda: rs.rob_ula(model, data, contamination=0.1, chains=1, iter_warmup=50,
                                         iter_sampling=50, seed=1, show_progress=False),
        "rs.dpvi": lambda: rs.dpvi(model, data, epsilon=1.0, steps=20, seed=1, show_progress=False),
        "rs.select_divergence": lambda: rs.select_divergence(model, data, grid=[rs.KL(), rs.BetaD(0.3)], chains=1,
                                                             iter_warmup=100, iter_sampling=100, seed=1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each walk's stops")
    args = parser.parse_args(argv)
    model, data = rs.glm("normal", standardize=False), regression()
    model.compile(show_progress=False)
    for name, call in calls(model, data).items():
        call()  # once before tracing: first-use work (loading the module, caches) is not the call's walk
        walk = walk_of(call)
        print(f"{name}: {len(walk.stops)} stops, {walk.files} files, {walk.climbs} climbs, "
              f"{walk.reentries} re-entries")
        if args.list:
            for stop in walk.stops:
                print(f"    {'  ' * layer_of(stop)}{stop}")


if __name__ == "__main__":
    main()
