"""Checks a generated program with stanc and points errors at the user's own lines."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..common.errors import StanCompileError
from ..common.resources import stan_include_path, uses_native_functions

if TYPE_CHECKING:
    from .spec import ModelSpec

_LOCATION = re.compile(r"line (\d+), column (\d+)")


def stanc_binary() -> str:
    """The stanc that ships inside the httpstan wheel (always installed with robust-stan)."""
    import httpstan

    return str(Path(httpstan.__file__).parent / "stanc")


def stanc_process(stan_code: str, options: list[str], filename: str = "program.stan",
           include_dirs: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, str]:
    """stanc run on ``stan_code`` (written to a temporary folder, which is also the working folder
    for outputs such as ``--o``) with the library and ``include_dirs`` on the include path (and
    ``--allow-undefined`` for a program that declares the native losses); the finished process and its
    error message, if any, naming ``filename``."""
    if uses_native_functions(stan_code):
        options = ["--allow-undefined", *options]
    with tempfile.TemporaryDirectory(prefix="robust_stan_") as tmp:
        path = Path(tmp) / "program.stan"
        path.write_text(stan_code)
        paths = ",".join([stan_include_path(), *include_dirs])
        done = subprocess.run(
            [stanc_binary(), "--include-paths", paths, "--filename-in-msg", filename, *options, str(path)],
            capture_output=True, text=True, cwd=tmp,  # no time limit: a niced process on busy cores is slow
        )
    message = (done.stderr.strip() or done.stdout.strip()).replace(str(path), filename) if done.returncode else ""
    return done, message


def run_stanc(stan_code: str, options: list[str], filename: str = "program.stan",
              include_dirs: tuple[str, ...] = ()) -> str:
    """stanc's standard output for ``stan_code`` with ``options`` (the robust-stan library and
    ``include_dirs`` on the include path). A program stanc rejects raises StanCompileError
    with stanc's own message, which names ``filename`` and the line."""
    done, message = stanc_process(stan_code, options, filename, include_dirs)
    if done.returncode != 0:
        raise StanCompileError(f"Stan cannot compile {filename}:\n{message}")
    return done.stdout


def program_info(stan_code: str, filename: str = "program.stan", include_dirs: tuple[str, ...] = ()) -> dict:
    """stanc's ``--info``: the program's data ("inputs"), parameters, transformed parameters,
    generated quantities and distributions, each variable with its type and dimensions."""
    return json.loads(run_stanc(stan_code, ["--info"], filename, include_dirs))


def canonical_program(stan_code: str, filename: str = "program.stan", include_dirs: tuple[str, ...] = ()) -> str:
    """stanc's canonical form of the program (includes inlined, braces on every block, comments
    kept where stanc keeps them), one statement per line."""
    return run_stanc(stan_code, ["--print-canonical", "--max-line-length", "100000"], filename, include_dirs)


def check_program(stan_code: str, spec: ModelSpec | None = None) -> str:
    """Run stanc on the program; return its warnings or raise StanCompileError.

    When the error sits on a line that came from the user's specification,
    the message names the fragment (data, parameters, priors or an argument)
    and the line number within it.
    """
    done, message = stanc_process(stan_code, ["--o", "program.hpp"])
    if done.returncode == 0:
        return done.stderr
    where = _user_location(stan_code, message, spec) if spec is not None else None
    if where:
        raise StanCompileError(f"Stan cannot compile your specification: {where}\n\nstanc said:\n{message}")
    raise StanCompileError(f"Stan cannot compile the generated program:\n{message}")


def _user_location(stan_code: str, message: str, spec: ModelSpec) -> str | None:
    """'<fragment> line <k>: <statement>' for the user's line that stanc's error points at."""
    from .spec import split_statements  # here: spec imports the formula parser, which a build does not need

    match = _LOCATION.search(message)
    if not match or "robust_stan.stanfunctions" in message.split("\n", 1)[0]:
        return None
    lines = stan_code.splitlines()
    line_number = int(match.group(1))
    if not 1 <= line_number <= len(lines):
        return None
    text = lines[line_number - 1].strip().rstrip(";").strip()
    fragments = {
        "priors": (spec.priors, spec.priors.splitlines()),
        "data": (spec.data, split_statements(spec.data)),
        "parameters": (spec.parameters_text, [p.text for p in spec.parameters]),
    }
    for fragment, (source, pieces) in fragments.items():
        for piece in pieces:
            piece = piece.strip().rstrip(";").strip()
            if piece and (piece == text or piece in text):
                return f"{fragment} line {_line_in(source, piece)}: {piece!r}"
    for p in spec.parameters:
        if f"{p.name}_copies" in text:
            return f"parameters line {_line_in(spec.parameters_text, p.text)}: {p.text!r}"
    for name, arg in spec.args.items():
        if arg.per_observation in lines[line_number - 1]:
            return f"the expression for {name!r}: {arg.per_observation!r}"
    return None


def _line_in(source: str, piece: str) -> int:
    """1-based line of ``source`` on which ``piece`` starts (1 when not found verbatim)."""
    at = source.find(piece.strip())
    return source[:at].count("\n") + 1 if at >= 0 else 1
