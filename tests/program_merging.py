"""Several of tests/stan_programs/ as one Stan program, so that a check made program by program
compiles once (each distinct program costs the suite a C++ build on each CI stack).

Each program's global names (its data, transformed data, parameters, transformed parameters and
generated quantities) are prefixed with the program's name (``y`` of eight_schools becomes
``eight_schools_y``), its model block becomes a nested block of the merged model block (so its
local variables stay its own), and the blocks are concatenated in the order of the programs.
The parameters are therefore those of the first program, then the second's, and so on, which is
the order :func:`parameter_stretches` gives theta's stretches in. The programs must have no functions block
and no comments that matter (comments are dropped).
"""

import re

import numpy as np

from .stan_program_densities import REFERENCE_LOG_DENSITIES, reference_dimension

BLOCKS = ("functions", "data", "transformed data", "parameters", "transformed parameters", "model",
          "generated quantities")
_TYPES = ("int", "real", "complex", "vector", "row_vector", "matrix", "simplex", "unit_vector", "ordered",
          "positive_ordered", "cholesky_factor_corr", "cholesky_factor_cov", "corr_matrix", "cov_matrix")
_DECLARATION = re.compile(rf"^(?:array\s*\[[^\]]*\]\s*)?(?:{'|'.join(_TYPES)})\b")


def _without_comments(code: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", code, flags=re.DOTALL))


def _closing_brace(code: str, opening: int) -> int:
    depth = 0
    for at in range(opening, len(code)):
        depth += {"{": 1, "}": -1}.get(code[at], 0)
        if depth == 0:
            return at
    raise ValueError("unbalanced braces")


def split_blocks(code: str) -> dict[str, str]:
    """The bodies of a program's blocks, by block name (comments dropped)."""
    code = _without_comments(code)
    blocks, at = {}, 0
    pattern = re.compile(r"\s*(" + "|".join(name.replace(" ", r"\s+") for name in reversed(BLOCKS)) + r")\s*\{")
    while code[at:].strip():
        match = pattern.match(code, at)
        if match is None:
            raise ValueError(f"no block starts at: {code[at:at + 40]!r}")
        end = _closing_brace(code, match.end() - 1)
        blocks[" ".join(match.group(1).split())] = code[match.end():end]
        at = end + 1
    return blocks


def _top_level_statements(body: str) -> list[str]:
    """The statements of a block body at its top level (a braced statement ends at its brace)."""
    statements, start, depth = [], 0, 0
    for at, character in enumerate(body):
        if character in "([{":
            depth += 1
        elif character in ")]}":
            depth -= 1
        if depth == 0 and (character == ";" or (character == "}" and body[start:at].strip())):
            statements.append(body[start:at + 1].strip())
            start = at + 1
    return statements


def declared_names(body: str) -> list[str]:
    """The names a block body declares at its top level."""
    names = []
    for statement in _top_level_statements(body):
        if _DECLARATION.match(statement):
            rest = re.sub(r"<[^<>]*>", "", statement)       # bounds
            rest = re.sub(r"\[[^\[\]]*\]", "", re.sub(r"\[[^\[\]]*\]", "", rest))  # sizes (one level nested)
            names.append(re.match(r"\s*(?:array\s*)?\w+\s+(\w+)", rest).group(1))
    return names


def merge_programs(programs: dict[str, str]) -> str:
    """One program holding ``programs`` (name -> Stan code), each program's names prefixed with its
    name and an underscore."""
    merged = {block: [] for block in BLOCKS}
    for prefix, code in programs.items():
        blocks = split_blocks(code)
        if "functions" in blocks:
            raise ValueError(f"{prefix}: programs with a functions block are not merged")
        names = [name for block in ("data", "transformed data", "parameters", "transformed parameters",
                                    "generated quantities") for name in declared_names(blocks.get(block, ""))]
        for block, body in blocks.items():
            for name in names:  # a name followed by "(" is a function of Stan's (beta, gamma), not the variable
                body = re.sub(rf"\b{name}\b(?!\s*\()", f"{prefix}_{name}", body)
            merged[block].append("{" + body + "}" if block == "model" else body)
    return "".join(f"{block} {{{''.join(bodies)}\n}}\n" for block, bodies in merged.items() if bodies)


def merged_data(data_by_program: dict[str, dict]) -> dict:
    """The data of a merged program: each program's entries under their prefixed names."""
    return {f"{prefix}_{key}": value for prefix, data in data_by_program.items() for key, value in data.items()}


def program_data(merged: dict, prefix: str) -> dict:
    """One program's entries of a merged program's data, under their own names."""
    return {key[len(prefix) + 1:]: value for key, value in merged.items() if key.startswith(prefix + "_")}


def merged_log_density(stretches: dict[str, slice]):
    """The reference log density of a merged program: the sum of each program's, each on its own
    stretch of theta (``stretches``: program name -> slice, from :func:`parameter_stretches`, in the
    merged program's order)."""

    def log_density(data, theta):
        theta = np.asarray(theta, dtype=float)
        end = max(where.stop for where in stretches.values())
        assert end == theta.size, f"theta has {theta.size} values, the programs {end}"
        return sum(REFERENCE_LOG_DENSITIES[name](program_data(data, name), theta[where])
                   for name, where in stretches.items())

    return log_density


def parameter_stretches(names: list[str], data: dict) -> dict[str, slice]:
    """Where each program's parameters sit in the merged program's theta."""
    stretches, at = {}, 0
    for name in names:
        size = reference_dimension(name, program_data(data, name))
        stretches[name] = slice(at, at + size)
        at += size
    return stretches
