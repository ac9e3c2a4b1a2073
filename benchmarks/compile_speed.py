"""Compile time of one Stan program's C++ on the httpstan engine, three ways (GCC or clang).

robust-stan builds a model without debug information (``-g0``) and with a precompiled
header of Stan's model header and its C interface (robust_stan/engines/httpstan_build.py).
The compiler is setuptools' (``CXX=clang++`` in the environment for clang).
This script builds a fresh program through robust-stan (which makes the precompiled
header if this environment has none), then compiles that program's generated C++ again
with the same compiler arguments:

- as httpstan alone would: Python's flags (``-g``), the C interface included as text;
- with ``-g0``;
- with ``-g0`` and the precompiled header (what robust-stan does).

With ``--other-compiler`` (GCC or clang, ``clang++-16`` say) the same C++ is also compiled
by that compiler with the same flags, as text and with a precompiled header of its own
(made as robust-stan makes it, in a scratch folder; the time it takes is printed too).

It prints each time (median of --repeats) and the ratios to the first, and the size of
each object file. The robustified-regression program of ``rs.glm("normal")`` is used, with
a prior scale that makes its text new.

    python benchmarks/compile_speed.py [--repeats 1] [--other-compiler clang++-16]
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
from robust_stan.engines.httpstan_build import (
    PRECOMPILED,
    STAN_PRECOMPILED_INCLUDES,
    _compiler_command,
    compiler_family,
    forced_headers,
    precompiled_header,
    using_precompiled_header,
)


def newest_precompiled_header(family: str, command: list[str]) -> tuple[Path, list[str]]:
    """The precompiled header robust-stan made last in this environment with the ``family`` compiler
    (``"gcc"`` or ``"clang"``) run as ``command`` (the compiler and Python's flags), and its compiler
    arguments."""
    import httpstan.cache

    made = f"robust_stan_pch.hpp{PRECOMPILED[family].suffix}"
    folders = [f for f in (httpstan.cache.cache_directory() / "robust_stan_pch").glob("*")
               if (f / made).exists() and (f / "arguments.json").exists()
               and "-DSTAN_MODEL_FVAR_VAR" not in (f / "arguments.json").read_text()
               and json.loads((f / "arguments.json").read_text())[:len(command)] == command]
    if not folders:
        sys.exit(f"no precompiled header was made for {command[0]}: see failed.log under "
                 f"{httpstan.cache.cache_directory() / 'robust_stan_pch'}")
    folder = max(folders, key=lambda f: (f / made).stat().st_mtime)
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
    parser.add_argument("--other-compiler", metavar="COMMAND", help="also compile with this compiler (GCC or clang)")
    args = parser.parse_args(argv)
    family = compiler_family(_compiler_command())
    if family is None:
        sys.exit("the compiler is neither GCC nor clang: robust-stan builds without a precompiled header here")
    model = rs.glm("normal", priors={"b": f"normal(0, {time.time_ns() % 10**9 / 10**8 + 1:.8f})"}, engine="httpstan")
    start = time.perf_counter()
    program = model.compile(show_progress=False)
    print(f"robust-stan's whole build of a new program (stanc, compile, link): {time.perf_counter() - start:.1f} s")
    source = next(Path(program.module.__file__).parent.glob("model_*.cpp"))
    header, arguments = newest_precompiled_header(family, _compiler_command())
    with_g = [a for a in arguments if a != "-g0"]
    interface, *others = forced_headers(program.stan_code)  # the C interface, then the native losses' header if used
    rest = [flag for other in others for flag in ("-include", str(other))]
    ways = {"httpstan's flags (-g), interface as text": with_g + ["-include", str(interface)] + rest,
            "-g0, interface as text": arguments + ["-include", str(interface)] + rest,
            "-g0 and the precompiled header (robust-stan)": arguments + using_precompiled_header(header, family) + rest}
    with tempfile.TemporaryDirectory() as scratch:
        if args.other_compiler:
            ways.update(other_compiler_ways(args.other_compiler, arguments, interface, rest, Path(scratch)))
        first = None
        for name, way in ways.items():
            seconds, size = timed_compile(way, source, args.repeats)
            first = first or seconds
            print(f"{name:56s} {seconds:6.1f} s  ratio {seconds / first:.2f}  object {size / 1e6:.1f} MB")


def other_compiler_ways(compiler: str, arguments: list[str], interface: Path, rest: list[str],
                        scratch: Path) -> dict[str, list[str]]:
    """The compiler arguments of ``compiler`` (in place of ``arguments[0]``) with the C interface as text and
    with a precompiled header of its own (the headers robust-stan precompiles), made under ``scratch`` (the
    time it takes is printed)."""
    other = [compiler] + arguments[1:]
    family = compiler_family(other)
    if family is None:
        sys.exit(f"{compiler} is neither GCC nor clang")
    start = time.perf_counter()
    header = precompiled_header(scratch, other, STAN_PRECOMPILED_INCLUDES, family)
    if header is None:
        sys.exit(f"{compiler} could not make the precompiled header: {next(scratch.glob('*/failed.log')).read_text()}")
    print(f"{compiler}'s precompiled header made in {time.perf_counter() - start:.1f} s")
    return {f"{compiler}: -g0, interface as text": other + ["-include", str(interface)] + rest,
            f"{compiler}: -g0 and its precompiled header": other + using_precompiled_header(header, family) + rest}


if __name__ == "__main__":
    main()
