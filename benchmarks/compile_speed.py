"""Compile time of one Stan program's C++ on the httpstan engine, three ways (GCC only).

robust-stan builds a model without debug information (``-g0``) and with a precompiled
header of Stan's model header and its C interface (robust_stan/engines/httpstan_build.py).
This script builds a fresh program through robust-stan (which makes the precompiled
header if this environment has none), then compiles that program's generated C++ again
with the same compiler arguments:

- as httpstan alone would: Python's flags (``-g``), the C interface included as text;
- with ``-g0``;
- with ``-g0`` and the precompiled header (what robust-stan does).

It prints each time (median of --repeats) and the ratios to the first, and the size of
each object file. The robustified-regression program of ``rs.glm("normal")`` is used, with
a prior scale that makes its text new.

    python benchmarks/compile_speed.py [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import robust_stan as rs
from robust_stan.engines.httpstan_build import _compiler_command, _is_gcc, forced_headers


def newest_precompiled_header() -> tuple[Path, list[str]]:
    """The precompiled header robust-stan made last in this environment, and its compiler arguments."""
    import httpstan.cache

    folders = [f for f in (httpstan.cache.cache_directory() / "robust_stan_pch").glob("*")
               if (f / "robust_stan_pch.hpp.gch").exists() and (f / "arguments.json").exists()
               and "-DSTAN_MODEL_FVAR_VAR" not in (f / "arguments.json").read_text()]
    folder = max(folders, key=lambda f: (f / "robust_stan_pch.hpp.gch").stat().st_mtime)
    return folder / "robust_stan_pch.hpp", json.loads((folder / "arguments.json").read_text())


def timed_compile(arguments: list[str], source: Path, repeats: int) -> tuple[float, int]:
    """Median seconds of compiling ``source`` to an object with ``arguments``, and the object's bytes."""
    seconds = []
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "model.o"
        for _ in range(repeats):
            start = time.perf_counter()
            subprocess.run(arguments + ["-c", str(source), "-o", str(target)], check=True, capture_output=True)
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds), target.stat().st_size


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    if not _is_gcc(_compiler_command()):
        sys.exit("the compiler is not GCC: robust-stan builds without a precompiled header here")
    model = rs.glm("normal", priors={"b": f"normal(0, {time.time_ns() % 10**9 / 10**8 + 1:.8f})"}, engine="httpstan")
    start = time.perf_counter()
    program = model.compile(show_progress=False)
    print(f"robust-stan's whole build of a new program (stanc, compile, link): {time.perf_counter() - start:.1f} s")
    source = next(Path(program.module.__file__).parent.glob("model_*.cpp"))
    header, arguments = newest_precompiled_header()
    with_g = [a for a in arguments if a != "-g0"]
    interface, *others = forced_headers(program.stan_code)  # the C interface, then the native losses' header if used
    rest = [flag for other in others for flag in ("-include", str(other))]
    ways = {"httpstan's flags (-g), interface as text": with_g + ["-include", str(interface)] + rest,
            "-g0, interface as text": arguments + ["-include", str(interface)] + rest,
            "-g0 and the precompiled header (robust-stan)": arguments + ["-include", str(header)] + rest}
    first = None
    for name, way in ways.items():
        seconds, size = timed_compile(way, source, args.repeats)
        first = first or seconds
        print(f"{name:48s} {seconds:6.1f} s  ratio {seconds / first:.2f}  object {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
