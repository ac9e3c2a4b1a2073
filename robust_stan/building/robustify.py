"""Rewrites an ordinary Stan program into a robust one: its likelihood statements become the
library's weighted robust losses, with the divergence, learning rate and weights as data.

stanc reads the program: ``--info`` says which variables are data, and its canonical
printing (``--print-canonical``, one statement per line, each block opening on a line
``<name> {`` and closing on a line ``}``) is the text this module rewrites. What is parsed
here is only what the rewrite needs, on that canonical text with comments blanked out:
block boundaries, top-level declarations (names and types), and single statements (an
outcome before ``~`` or before ``|`` in a ``*_lpdf`` / ``*_lpmf`` call, a distribution's
name and its arguments).
"""

from __future__ import annotations

import ast
import functools
import itertools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..common.errors import RobustStanInputError
from ..common.resources import LIBRARY_FILE, NATIVE_FILE
from .families import FAMILIES, family_of_stan_name

#: Names the rewritten program adds; a program that already uses one is refused.
SWITCHES = ("rs_divergence", "rs_divergence_param", "rs_learning_rate", "rs_pointwise", "rs_weights_are_parameters")
#: Parameters robustify adds (size 0 unless rs_weights_are_parameters = 1): rs_weight_parameters_<outcome>.
WEIGHT_PARAMETERS = "rs_weight_parameters_"


def divergence_switches(divergence) -> dict:
    """A :class:`~robust_stan.building.divergences.Divergence` as a rewritten program's data,
    ``rs_divergence`` and ``rs_divergence_param``."""
    switches = divergence.stan_data()
    return {"rs_divergence": switches["divergence"], "rs_divergence_param": switches["divergence_param"]}


@dataclass(frozen=True)
class _Translation:
    """How a Stan distribution maps onto a family of the robust-stan library."""

    family: str      # library family (robust_<family>_weighted_*)
    outcome: str     # "vector", "int_array" or "vector_array": the outcome type the library takes
    arity: int       # number of arguments the Stan distribution takes
    rewrite: str     # the library's arguments, from the distribution's {0}, {1}, ... (parenthesised
                     # where an argument is more than a name or an indexed name)


# Each supported distribution and its exact translation (same density, reparameterised).
_TRANSLATIONS = {
    "normal": _Translation("normal", "vector", 2, "{0}, {1}"),
    "normal_id_glm": _Translation("normal", "vector", 4, "{1} + {0} * {2}, {3}"),
    "student_t": _Translation("student_t", "vector", 3, "{0}, {1}, {2}"),
    "cauchy": _Translation("student_t", "vector", 2, "1, {0}, {1}"),
    "exponential": _Translation("exponential", "vector", 1, "{0}"),
    "bernoulli_logit": _Translation("bernoulli_logit", "int_array", 1, "{0}"),
    "bernoulli": _Translation("bernoulli_logit", "int_array", 1, "logit({0})"),
    "bernoulli_logit_glm": _Translation("bernoulli_logit", "int_array", 3, "{1} + {0} * {2}"),
    "binomial_logit": _Translation("binomial_logit", "int_array", 2, "{0}, {1}"),
    "binomial": _Translation("binomial_logit", "int_array", 2, "{0}, logit({1})"),
    "poisson_log": _Translation("poisson_log", "int_array", 1, "{0}"),
    "poisson": _Translation("poisson_log", "int_array", 1, "log({0})"),
    "poisson_log_glm": _Translation("poisson_log", "int_array", 3, "{1} + {0} * {2}"),
    "categorical_logit": _Translation("categorical_logit", "int_array", 1, "({0})'"),
    "categorical": _Translation("categorical_logit", "int_array", 1, "log({0})'"),
    "multi_normal_cholesky": _Translation("multi_normal_cholesky", "vector_array", 2, "{0}, {1}"),
    "multi_normal": _Translation("multi_normal_cholesky", "vector_array", 2, "{0}, cholesky_decompose({1})"),
    "lognormal": _Translation("lognormal", "vector", 2, "{0}, {1}"),
    "gamma": _Translation("gamma", "vector", 2, "{0}, {1}"),
    "weibull": _Translation("weibull", "vector", 2, "{0}, {1}"),
    "beta": _Translation("beta", "vector", 2, "{0}, {1}"),
    "neg_binomial_2_log": _Translation("neg_binomial_2_log", "int_array", 2, "{0}, {1}"),
    "neg_binomial_2": _Translation("neg_binomial_2_log", "int_array", 2, "log({0}), {1}"),
    "neg_binomial_2_log_glm": _Translation("neg_binomial_2_log", "int_array", 4, "{1} + {0} * {2}, {3}"),
    "beta_binomial": _Translation("beta_binomial", "int_array", 3, "{0}, {1}, {2}"),
    "ordered_logistic": _Translation("ordered_logistic", "int_array", 2, "{0}, {1}"),
    "ordered_logistic_glm": _Translation("ordered_logistic", "int_array", 3, "{0} * {1}, {2}"),
    "ordered_probit": _Translation("ordered_probit", "int_array", 2, "{0}, {1}"),
}
_DISCRETE = {"int_array"}
_TABLED_FAMILIES = {family.stan_name for family in FAMILIES.values() if family.integral_table}
#: Families whose beta and gamma losses have a native (C++) version, used for vectorised statements.
_NATIVE_FAMILIES = {family.stan_name for family in FAMILIES.values() if family.native}
_IDENT = re.compile(r"[A-Za-z]\w*")
_DECLARATION = re.compile(r"^\s*(?P<type>[a-z_]+(\[[^\]]*\])?(\s+[a-z_]+(\[[^\]]*\])?)?)\s+(?P<names>[A-Za-z]\w*.*);")
_TARGET_TERM = r"\b\w+_(lpdf|lupdf|lpmf|lupmf|lcdf|lccdf|cdf)\s*\(\s*(?:(?:to_vector|to_array_1d)\s*\(\s*)?{name}\b"


class RobustifyError(RobustStanInputError):
    """A program robustify cannot rewrite; the message names the statement, its line and why."""


@dataclass(frozen=True)
class Likelihood:
    """One likelihood statement of the user's program, as robustify rewrote it."""

    outcome: str        # the data variable
    distribution: str   # as the user wrote it (normal, poisson, ...)
    family: str         # the library family it became
    index: str | None   # the loop variable of a per-observation statement; None when vectorised
    line: int           # line in the user's program (1-based; 0 when it could not be located)
    statement: str      # the statement, canonical form
    rows: str | None = None  # its number of rows when that is not size(outcome): a data-block expression

    @property
    def vectorised(self) -> bool:
        return self.index is None

    @property
    def elements_are_rows(self) -> bool:
        """A two-dimensional outcome: each element an observation, flattened row after row."""
        return self.rows == f"num_elements({self.outcome})"

    @property
    def one_observation(self) -> bool:
        """The outcome is one observation (a scalar, or a vector of a multivariate family)."""
        return self.rows == "1"

    @property
    def native(self) -> bool:
        """Whether its beta and gamma losses go through the native loss (robust_stan_native.hpp)."""
        return self.vectorised and self.family in _NATIVE_FAMILIES


@dataclass(frozen=True)
class RobustifiedProgram:
    """The rewritten program and what it rewrote."""

    stan_code: str
    likelihoods: tuple[Likelihood, ...]
    #: parameters with no prior statement and an unbounded support (an improper prior, which a bounded
    #: loss cannot make proper)
    without_prior: tuple[str, ...] = ()

    @property
    def outcomes(self) -> list[str]:
        return list(dict.fromkeys(lik.outcome for lik in self.likelihoods))


# -- small text tools --------------------------------------------------------------------------
def _top_level(text: str, separator: str) -> list[int]:
    """Positions of ``separator`` in ``text`` outside brackets and strings."""
    found, depth, quoted = [], 0, False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == separator and depth == 0:
            found.append(i)
    return found


def _split_top(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` characters outside brackets and strings."""
    bounds = [-1, *_top_level(text, separator), len(text)]
    return [text[a + 1:b].strip() for a, b in zip(bounds, bounds[1:])]


def _without_comments(lines: list[str]) -> list[str]:
    """The lines with ``//`` and ``/* */`` comments (across lines too) replaced by spaces, strings
    kept, so that a commented-out statement is never read as code."""
    out, in_block = [], False
    for line in lines:
        chars, i, quoted = list(line), 0, False
        while i < len(chars):
            if in_block:
                if line.startswith("*/", i):
                    chars[i:i + 2] = "  "
                    in_block = False
                    i += 2
                    continue
                chars[i] = " "
            elif chars[i] == '"':
                quoted = not quoted
            elif not quoted and line.startswith("//", i):
                chars[i:] = " " * (len(chars) - i)
                break
            elif not quoted and line.startswith("/*", i):
                chars[i:i + 2] = "  "
                in_block = True
                i += 2
                continue
            i += 1
        out.append("".join(chars))
    return out


def _one_statement_per_line(canonical: str) -> tuple[list[str], list[str]]:
    """(lines, the same lines with comments blanked) of canonical text, each statement on one line.

    stanc's canonical printing breaks a statement where a comment sits inside it
    (``target += log_sum_exp(a // why`` then ``+ b, c);``) and writes ``} else // why`` above
    the branch's ``{``. Such a line, whose code does not end a statement or open or close a block,
    is joined with the lines after it until one does; the comments go to the end of the joined line.
    """
    lines, code = canonical.splitlines(), _without_comments(canonical.splitlines())
    out_lines: list[str] = []
    out_code: list[str] = []
    k = 0
    while k < len(lines):
        text, comments = code[k].rstrip(), [_comment_part(lines[k], code[k])]
        while text.strip() and not text.endswith(("{", "}", ";")) and not text.lstrip().startswith("#") \
                and k + 1 < len(lines):
            k += 1
            if code[k].strip():
                text = f"{text} {code[k].strip()}"
            comments.append(_comment_part(lines[k], code[k]))
        comment = " ".join(c for c in comments if c)
        out_code.append(text)
        out_lines.append(f"{text}  {comment}" if comment and len(comments) > 1 else lines[k] if len(comments) == 1
                         else text)
        k += 1
    return out_lines, out_code


@functools.lru_cache(maxsize=4)
def _source_code(source: str) -> tuple[str, ...]:
    """The user's own lines with comments blanked, computed once per program."""
    return tuple(_without_comments(source.splitlines()))


def _atom(expression: str) -> str:
    """``expression`` as one operand: unchanged when it is a name, a number or an indexed name,
    else in parentheses."""
    return expression if re.fullmatch(r"[\w.]+(\[[^\[\]]*\])?", expression) else f"({expression})"


def _closing(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at ``open_at``."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced brackets in {text!r}")


def _statement_end(line: str) -> int:
    """Index of the ``;`` that ends the statement on a canonical line (-1 when there is none)."""
    ends = _top_level(line, ";")
    return ends[0] if ends else -1


def _block(lines: list[str], name: str) -> tuple[int, int] | None:
    """(first, last) line numbers (0-based) of the block's opening and closing lines."""
    for i, line in enumerate(lines):
        if line.rstrip() == f"{name} {{":
            for j in range(i + 1, len(lines)):
                if lines[j].startswith("}"):
                    return i, j
    return None


def _declarations(lines: list[str], block: tuple[int, int] | None) -> dict[str, str]:
    """Top-level declarations of a canonical block (comments blanked): name -> its type text.
    ``vector[N] y, x;`` declares both names."""
    out: dict[str, str] = {}
    if block is None:
        return out
    for line in lines[block[0] + 1:block[1]]:
        if line.startswith("  ") and not line.startswith("   "):
            match = _DECLARATION.match(re.sub(r"<[^<>]*>", "", line))
            if match and match.group("type").split("[")[0].strip() not in ("target", "print", "reject"):
                for piece in _split_top(match.group("names"), ","):
                    name = re.match(r"[A-Za-z]\w*", piece)
                    if name:
                        out[name.group(0)] = match.group("type")
    return out


#: Outcome kinds (:func:`_outcome_kind`) whose elements are the observations, flattened row after row.
_TWO_DIMENSIONAL_KINDS = ("real_array2", "int_array2", "matrix")
#: Kinds an outcome may have when a statement reads it through to_vector or to_array_1d.
_FLATTENED_KINDS = ("vector", "row_vector", "real_array", "int_array", *_TWO_DIMENSIONAL_KINDS)


def _outcome_kind(type_text: str) -> str:
    """The shape class of a data declaration: vector, row_vector, real_array, int_array,
    vector_array, real or int (a scalar: one observation), real_array2, int_array2 or matrix
    (two-dimensional: each element an observation, rows flattened one after another), or other."""
    text = re.sub(r"<[^<>]*>", "", type_text).strip()
    if text in ("real", "int"):
        return text
    if text.startswith("vector"):
        return "vector"
    if text.startswith("row_vector"):
        return "row_vector"
    if text.startswith("matrix"):
        return "matrix"
    match = re.match(r"array\[([^\]]*)\]\s*(\w+)", text)
    if match and "," not in match.group(1):
        return {"real": "real_array", "int": "int_array", "vector": "vector_array"}.get(match.group(2), "other")
    if match and match.group(1).count(",") == 1:
        return {"real": "real_array2", "int": "int_array2"}.get(match.group(2), "other")
    return "other"


# -- finding the likelihood statements -------------------------------------------------------
@dataclass
class _Found:
    line_index: int       # in the canonical lines
    outcome_text: str
    distribution: str
    arguments: list[str]
    truncated: bool
    whole_statement: bool  # False: a *_lpdf call inside a larger expression (not a term added to the target)
    statement: str
    term: str | None = None  # the call, when it is one added term of a longer `target +=` (the others are kept)


def _statements_on(line: str, line_index: int = -1) -> list[_Found]:
    """The distribution statements on one canonical line: a ``~`` statement or the ``*_lp?f``
    calls of a ``target +=``."""
    stripped = line.strip()
    end = _statement_end(stripped)
    if end < 0:
        return []
    statement = stripped[:end + 1]
    body = stripped[:end]
    found = []
    parts = _split_top(body, "~")
    if len(parts) == 2:
        outcome, rest = parts
        truncated = False
        match = re.match(r"(\w+)\s*\(", rest)
        if match:
            close = _closing(rest, match.end() - 1)
            truncated = rest[close + 1:].strip().startswith("T[")
            arguments = [a for a in _split_top(rest[match.end():close], ",") if a]
            found.append(_Found(line_index, outcome, match.group(1), arguments, truncated, True, statement))
        return found
    if body.startswith("target +="):
        expression = body[len("target +="):].strip()
        terms = _additive_terms(expression)
        added = {(start, end) for sign, start, end in terms if sign == "+"}
        several = len(terms) > 1
        for match in re.finditer(r"\b(\w+)_(lpdf|lupdf|lpmf|lupmf)\s*\(", expression):
            close = _closing(expression, match.end() - 1)
            inside = expression[match.end():close]
            pieces = _split_top(inside, "|")
            if len(pieces) != 2:
                continue
            arguments = [a for a in _split_top(pieces[1], ",") if a]
            whole = (match.start(), close + 1) in added
            term = expression[match.start():close + 1] if whole and several else None
            found.append(_Found(line_index, pieces[0], match.group(1), arguments, False, whole, statement, term))
    return found


def _additive_terms(expression: str) -> list[tuple[str, int, int]]:
    """(sign, start, end) of each term of ``expression`` that is added or subtracted at the top
    level (outside brackets; the sign of an exponent, 1e+3, is no operator)."""
    cuts, depth = [], 0
    for i, ch in enumerate(expression):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in "+-" and depth == 0:
            before = expression[:i].rstrip()
            exponent = re.search(r"(?<![\w.])\d+(\.\d*)?[eE]$", before) or re.search(r"(?<![\w.])\.\d+[eE]$", before)
            if not exponent and (not before or before[-1] not in "+-*/^%|&<>=!?:,("):
                cuts.append(i)
    terms, start, sign = [], 0, "+"
    if expression.lstrip().startswith("-"):
        start, sign = expression.index("-") + 1, "-"
    for cut in [*cuts, len(expression)]:
        if cut < start:
            continue
        text = expression[start:cut]
        left = len(text) - len(text.lstrip())
        terms.append((sign, start + left, start + len(text.rstrip())))
        if cut < len(expression):
            sign, start = expression[cut], cut + 1
    return terms


def _user_line(source: str, found: _Found, outcome: str, used: set[int]) -> int:
    """The line of the user's own text that holds the statement (0 when not found)."""
    patterns = [rf"\b{re.escape(outcome)}\b[^;~]*~\s*{re.escape(found.distribution)}\b",
                rf"\b{re.escape(found.distribution)}_l\w*\s*\(\s*{re.escape(outcome)}\b"]
    lines = _source_code(source)
    for pattern in patterns:
        for number, text in enumerate(lines, start=1):
            if number not in used and re.search(pattern, text):
                used.add(number)
                return number
    return 0


def likelihood_outcomes(canonical: str, info: dict) -> list[str]:
    """The data and transformed data variables that are the outcome of a distribution statement of
    the model block (``y ~ ...``, ``y[n] ~ ...``, ``target += *_lpdf(y | ...)``), in order of
    appearance: what :func:`robust_stan.from_stan` reports as observed data. Nothing is refused here."""
    _, code = _one_statement_per_line(canonical)
    model = _block(code, "model")
    data = set(info["inputs"]) | set(_declarations(code, _block(code, "transformed data")))
    outcomes: list[str] = []
    for k in range(model[0] + 1, model[1]) if model else ():
        for statement in _statements_on(code[k], k):
            text = _as_indexed(statement.outcome_text).strip()
            flattened = _flattening(text)
            match = re.fullmatch(r"([A-Za-z]\w*)\s*(\[.*\])?", flattened[1] if flattened else text)
            if match and match.group(1) in data and match.group(1) not in outcomes:
                outcomes.append(match.group(1))
    return outcomes


# -- the rewrite ---------------------------------------------------------------------------------
def robustify_program(source: str, canonical: str, info: dict, likelihood="auto",
                      filename: str = "program.stan") -> RobustifiedProgram:
    """The robust version of a program from its canonical text and stanc ``--info``.

    ``likelihood`` is "auto" (every ``~`` / ``target += *_lpdf`` statement whose outcome is a
    data variable) or a list of data variable names. Raises :class:`RobustifyError` naming the
    statement and its line for what cannot be rewritten.
    """
    lines, code = _one_statement_per_line(canonical)
    data_names = set(info["inputs"])
    model = _block(code, "model")
    if model is None:
        raise RobustifyError(f"{filename}: the program has no model block, so there is no likelihood to robustify")
    transformed_types = _declarations(code, _block(code, "transformed data"))
    data_types = {**_declarations(code, _block(code, "data")), **transformed_types}
    transformed_data = set(transformed_types)
    used_names = data_names | transformed_data | set(info["parameters"]) | set(info["transformed parameters"]) \
        | set(info["generated quantities"])
    clash = sorted(n for n in used_names | set(_IDENT.findall("\n".join(code)))
                   if n in SWITCHES or n == "rs_row" or n.startswith(("rs_weights_", "rs_log_lik_", "rs_robust_loss_",
                                                                       "rs_times_counted_", WEIGHT_PARAMETERS)))
    if clash:
        raise RobustifyError(f"{filename}: the program already uses the name(s) {clash}, which robustify adds; "
                             "rename them")
    wanted = _wanted_outcomes(likelihood, data_names | transformed_data, filename,
                              lambda: _statements_on_non_data(code, model, info, source, filename))

    found: list[tuple[_Found, str, str | None]] = []
    for k in range(model[0] + 1, model[1]):
        for statement in _statements_on(code[k], k):
            target = _classify(statement, data_names, transformed_data, wanted, source, filename)
            if target is not None:
                found.append((statement, *target))
    outcomes = [outcome for _, outcome, _ in found]
    branches = _branch_paths(code, model)
    counted = set()  # outcomes whose rows are counted at run time, so that none enters twice
    for outcome in sorted(set(outcomes)):
        on_it = [(s, index) for s, o, index in found if o == outcome]
        exclusive = all(_exclusive(branches[a.line_index], branches[b.line_index]) and i == j
                        for (a, i), (b, j) in itertools.combinations(on_it, 2))
        if not exclusive and any(index is None for _, index in on_it):
            used: set[int] = set()
            where = [_where(source, s, outcome, used, filename) for s, _ in on_it]
            raise RobustifyError(f"{'; '.join(where)}: several likelihood statements on the outcome {outcome!r}, one "
                                 "of them on all its rows; robustify needs each row in one statement (all of the "
                                 "likelihood in one statement, statements on parts of the rows, or statements on "
                                 "exclusive branches of one if/else)")
        if any(index is not None for _, index in on_it) or not exclusive:
            counted.add(outcome)
    _refuse_other_terms_on(outcomes, found, code, model, source, filename)
    if wanted is not None:
        missing = sorted(set(wanted) - set(outcomes))
        if missing:
            raise RobustifyError(f"{filename}: likelihood={likelihood!r}: no `~` or `target += *_lpdf` statement "
                                 f"on {missing} in the model block")
    if not found:
        not_data = _statements_on_non_data(code, model, info, source, filename)
        raise RobustifyError(f"{filename}: found no likelihood statement (a `~` or `target += *_lpdf(...)` statement "
                             "whose outcome is a variable of the data or transformed data block)"
                             + "".join(f"; {where}: {why}" for _, where, why in not_data)
                             + ". A likelihood accumulated by hand (an HMM's forward algorithm, a mixture marginalised "
                             "with log_sum_exp or log_mix, your own _lpdf function, `target += -0.5 * ...`) is not a "
                             "sum over observations of a family robust-stan has a loss for, so there is no "
                             "per-observation term to replace. Where the model allows, write the likelihood as "
                             "statements on the observations (`y[n] ~ normal(...)`); otherwise fit the program as "
                             "written (rs.from_stan)")

    likelihoods: list[Likelihood] = []
    rewritten: dict[int, list[str]] = {}
    pointwise: dict[int, list[str]] = {}
    terms: dict[int, list[str]] = {}
    used_lines: set[int] = set()
    array_names = _array_names(code)
    for statement, outcome, index in found:
        lik, model_line, gq_lines = _rewrite(statement, outcome, index, data_types[outcome], source, used_lines,
                                             filename, array_names, outcome in counted)
        if outcome in transformed_data:
            described = _describe(source, statement, lik.line, filename)
            lik = replace(lik, rows=_transformed_outcome_rows(outcome, data_types[outcome], data_names, described))
        likelihoods.append(lik)
        rewritten.setdefault(statement.line_index, []).append(model_line)
        pointwise.setdefault(statement.line_index, []).extend(gq_lines)
        if statement.term is not None:
            terms.setdefault(statement.line_index, []).append(statement.term)
    for k, rewritten_terms in terms.items():  # the other terms of a `target +=` stay, in a statement of their own
        rest = _without_terms(code[k].strip(), rewritten_terms)
        for statement, outcome, _ in found:
            if statement.line_index == k and re.search(_TARGET_TERM.format(name=re.escape(outcome)), rest):
                raise RobustifyError(f"{_where(source, statement, outcome, set(), filename)}: another term of this "
                                     f"statement also reads the outcome {outcome!r} (e.g. a censored row's lccdf); "
                                     "robustify cannot weight those rows")
        if rest:
            rewritten[k].insert(0, rest)
    return RobustifiedProgram(_assemble(lines, code, model, likelihoods, rewritten, pointwise, filename, counted),
                              tuple(likelihoods), _without_prior(code, model))


#: Parameter types whose support is bounded whatever their constraints.
_COMPACT_TYPES = ("simplex", "unit_vector", "corr_matrix", "cholesky_factor_corr")


def _without_prior(code: list[str], model: tuple[int, int]) -> tuple[str, ...]:
    """Parameters that no statement of the model block gives a density (no ``~`` or ``target +=
    *_lpdf`` with the parameter in its outcome) and whose support is unbounded (not both a lower and
    an upper bound, nor a compact type such as a simplex): their prior is improper (flat)."""
    block = _block(code, "parameters")
    if block is None:
        return ()
    unbounded = []
    for line in code[block[0] + 1:block[1]]:
        match = re.match(r"\s*(?P<type>[a-z_]+)\s*(?P<constraint><[^;]*>)?\s*(\[[^\]]*\])?\s*(?P<name>[A-Za-z]\w*)\s*;",
                         re.sub(r"^\s*array\[[^\]]*\]\s*", "", line))
        if match is None or match.group("name").startswith(WEIGHT_PARAMETERS):
            continue
        constraint = match.group("constraint") or ""
        bounded = "lower" in constraint and "upper" in constraint
        if not bounded and not match.group("type").startswith(_COMPACT_TYPES):
            unbounded.append(match.group("name"))
    with_density = set()
    for k in range(model[0] + 1, model[1]):
        for statement in _statements_on(code[k], k):
            with_density |= set(_IDENT.findall(statement.outcome_text))
    return tuple(name for name in unbounded if name not in with_density)


def _branch_paths(code: list[str], model: tuple[int, int]) -> dict[int, tuple[tuple[int, int], ...]]:
    """For each line of the model block, the if/else branches it lies in: ((chain, branch), ...),
    outermost first, where ``chain`` numbers the `if` statements and ``branch`` counts its
    `else if` / `else` parts (canonical text: every branch opens a braced block)."""
    frames: list[tuple[int, int] | None] = []  # None: a block that is no branch (a loop, a plain block)
    chains, paths = 0, {}
    for k in range(model[0] + 1, model[1]):
        line = code[k].strip()
        if line.startswith("}") and line.endswith("{") and "else" in line:  # `} else {`, `} else if (...) {`
            chain, branch = frames.pop() or (-1, -1)
            frames.append((chain, branch + 1))
        elif line.endswith("{"):
            if line.startswith(("if (", "if(")):
                frames.append((chains, 0))
                chains += 1
            else:
                frames.append(None)
        elif line.startswith("}") and frames:
            frames.pop()
        paths[k] = tuple(frame for frame in frames if frame is not None)
    return paths


def _exclusive(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    """Whether two lines lie in different branches of one if/else chain (so at most one runs)."""
    branch_of = dict(a)
    return any(chain in branch_of and branch_of[chain] != branch for chain, branch in b)


def _without_terms(statement: str, removed: list[str]) -> str:
    """``target += <expression>;`` without the added terms ``removed``: the statement that keeps the
    others, or "" when none is left."""
    expression = statement[len("target +="):statement.rindex(";")].strip()
    removed, kept = list(removed), []
    for sign, start, end in _additive_terms(expression):
        text = expression[start:end]
        if sign == "+" and text in removed:
            removed.remove(text)  # one occurrence: the same call added twice is rewritten twice
            continue
        kept.append(("- " if sign == "-" else "+ ") + text)
    if not kept:
        return ""
    joined = " ".join(kept)
    return f"target += {joined[2:] if joined.startswith('+ ') else joined};"


def _refuse_other_terms_on(outcomes: list[str], found, code: list[str], model: tuple[int, int], source: str,
                           filename: str) -> None:
    """An error when an outcome also enters the target elsewhere (a censored branch's lccdf, a
    second term): those rows would be left out of the robust loss and of its weights."""
    rewritten_lines = {statement.line_index for statement, _, _ in found}
    for outcome in outcomes:
        term = re.compile(_TARGET_TERM.format(name=re.escape(outcome)))
        for k in range(model[0] + 1, model[1]):
            line = code[k].strip()
            if k in rewritten_lines or not line.startswith("target +=") or not term.search(line):
                continue
            number = next((n for n, text in enumerate(_source_code(source), start=1)
                           if term.search(text)), 0)
            where = f"{filename}, line {number}" if number else filename
            raise RobustifyError(f"{where}: `{line}` is a second term of the outcome {outcome!r} besides its "
                                 "likelihood statement (e.g. a censored branch); robustify cannot weight those rows. "
                                 "Pass likelihood=[...] without it, or write the likelihood as one statement")


def _statements_on_non_data(code: list[str], model: tuple[int, int], info: dict, source: str,
                            filename: str) -> list[tuple[str, str, str]]:
    """(outcome, where, why) for each distribution statement of the model block whose outcome is a
    transformed parameter or a local variable of the model block: not data, so not a likelihood."""
    kinds = {**dict.fromkeys(info["transformed parameters"], "a transformed parameter"),
             **dict.fromkeys(info["generated quantities"], "a generated quantity")}
    out = []
    for k in range(model[0] + 1, model[1]):
        for statement in _statements_on(code[k], k):
            flattened = _flattening(statement.outcome_text)
            names = [flattened[1]] if flattened else _IDENT.findall(statement.outcome_text)
            if not names or names[0] in info["inputs"] or names[0] in info["parameters"]:
                continue
            kind = kinds.get(names[0], "a local variable of the model block")
            out.append((names[0], _where(source, statement, names[0], set(), filename),
                        f"the outcome {names[0]!r} is {kind}, not a variable of the data block, so robustify does "
                        "not read this statement as a likelihood (write it on the data variable itself)"))
    return out


def _wanted_outcomes(likelihood, data_names: set[str], filename: str,
                     statements_on_non_data: Callable[[], list[tuple[str, str, str]]]) -> list[str] | None:
    """None for "auto", else the named outcomes; names that are not data are refused, with the
    statements on them (``statements_on_non_data()``: (outcome, where, why)) named first."""
    if likelihood == "auto" or likelihood is None:
        return None
    names = [likelihood] if isinstance(likelihood, str) else list(likelihood)
    if not names or not all(isinstance(n, str) for n in names):
        raise RobustStanInputError(f"likelihood: give 'auto' or a list of data variable names, got {likelihood!r}")
    not_data = sorted(set(names) - data_names)
    if not_data:
        statements = "".join(f"{where}: {why}; " for name, where, why in statements_on_non_data() if name in not_data)
        raise RobustifyError(f"{statements}likelihood: {not_data} {'is' if len(not_data) == 1 else 'are'} not in "
                             f"the data block of {filename}; robustify can only make the likelihood of data "
                             "variables robust (an outcome that is a transformed or generated variable is not data)")
    return names


def _where(source: str, statement: _Found, outcome: str, used: set[int], filename: str) -> str:
    """'<file>, line <k>: `<the statement as the user wrote it>`' (the canonical text when not found)."""
    return _describe(source, statement, _user_line(source, statement, outcome, used), filename)


def _describe(source: str, statement: _Found, line: int, filename: str) -> str:
    if not line:
        return f"{filename}: `{statement.statement}`"
    return f"{filename}, line {line}: `{source.splitlines()[line - 1].split('//')[0].strip()}`"


def _as_indexed(outcome_text: str) -> str:
    """A statement's outcome, ``segment(y, pos, n)`` written as the slice ``y[pos:(pos + n - 1)]``."""
    segment = re.fullmatch(r"segment\s*\((.*)\)", outcome_text.strip())
    if segment and len(_split_top(segment.group(1), ",")) == 3:
        name, first, count = _split_top(segment.group(1), ",")
        return f"{name}[{first}:({first} + {count} - 1)]"
    return outcome_text


def _flattening(outcome_text: str) -> tuple[str, str] | None:
    """(function, name) for an outcome written ``to_vector(y)`` or ``to_array_1d(y)``, else None."""
    match = re.fullmatch(r"(to_vector|to_array_1d)\s*\(\s*([A-Za-z]\w*)\s*\)", outcome_text.strip())
    return (match.group(1), match.group(2)) if match else None


def _classify(statement: _Found, data_names: set[str], transformed_data: set[str], wanted: list[str] | None,
              source: str, filename: str) -> tuple[str, str | None] | None:
    """(outcome, loop index) for a likelihood statement, None for any other statement, or an error."""
    text = _as_indexed(statement.outcome_text)
    flattened = _flattening(text)
    if flattened is not None and flattened[1] in data_names | transformed_data:
        text = flattened[1]
    identifiers = _IDENT.findall(text)
    base = identifiers[0] if identifiers else ""
    match = re.fullmatch(r"([A-Za-z]\w*)\s*(\[(?P<index>.*)\])?", text)
    unindexed = text
    while re.search(r"\[[^\[\]]*\]", unindexed):  # names inside indexes (x[2:T]) are not the outcome
        unindexed = re.sub(r"\[[^\[\]]*\]", "", unindexed)
    data_names = data_names | transformed_data  # an outcome computed in transformed data is data too
    on_data = [n for n in _IDENT.findall(unindexed) if n in data_names]
    if not on_data:
        return None
    if not match or base not in data_names:
        if wanted is not None and not set(on_data) & set(wanted):
            return None
        raise RobustifyError(f"{_where(source, statement, on_data[0], set(), filename)}: the outcome `{text}` is an "
                             f"expression of the data variable {on_data[0]!r}, not the variable itself; robustify "
                             "needs the observations as they are declared in the data block")
    if wanted is not None and base not in wanted:
        return None
    where = _where(source, statement, base, set(), filename)
    if not statement.whole_statement:
        raise RobustifyError(f"{where}: the likelihood term of {base!r} is part of a larger expression; robustify "
                             "rewrites a term that is added to the target, "
                             f"`target += {statement.distribution}_lpdf({base} | ...) + ...;`. Inside log_mix or "
                             "log_sum_exp it is one component of a mixture, and the robust loss of a mixture needs "
                             "the integral of the whole mixture density to the power 1 + a, which robust-stan does "
                             "not have (each component's integral alone would give a different loss); fit the "
                             "program as written (rs.from_stan), or, if the mixture is over a latent label you can "
                             "observe, state each row's component density directly")
    if statement.truncated:
        raise RobustifyError(f"{where}: truncation T[,] is not supported (the robust loss of a truncated "
                             "distribution needs its own integral term)")
    index = match.group("index")
    if index is not None:
        parts = _split_top(index, ",")
        index = ", ".join(parts)
        ranges = [part for part in parts if _top_level(part, ":")]
        if len(parts) > 2 or len(ranges) > 1 or any(part in data_names for part in parts):
            raise RobustifyError(f"{where}: {base!r} is indexed by `{index}`, so its observations cannot be told "
                                 "apart (robustify takes the whole variable, one element y[n] or y[i, j] per "
                                 "statement, a slice y[lo:hi], segment(y, pos, n), y[lo:hi, j] or y[i, lo:hi], or one "
                                 "row y[i] of a two-dimensional outcome; an array of indexes, y[idx], may repeat rows)")
    return base, index


def _as_library_arguments(arguments: str, family: str, array_names: set[str]) -> str:
    """The library's arguments with each real-or-vector one that mentions an array or a row vector
    (outside its indexes), or transposes, wrapped in the library's ``rs_vec``, which makes a one-dimensional array a vector and
    leaves a real a real (stanc picks the overload, so an indexed element stays a scalar)."""
    takes = family_of_stan_name(family).args
    pieces = _split_top(arguments, ",")
    out = []
    for k, piece in enumerate(pieces):
        real_or_vector = k < len(takes) and takes[k].shared_type == "real"
        out.append(f"rs_vec({piece})" if real_or_vector and _may_be_an_array(piece, array_names) else piece)
    return ", ".join(out)


def _may_be_an_array(expression: str, array_names: set[str]) -> bool:
    """Whether ``expression`` may be a one-dimensional array or a row vector: it transposes, or names
    one of ``array_names`` unindexed, sliced (``theta[1:3]``) or indexed by an array (``theta[g]``);
    ``theta[n]`` is one element."""
    if "'" in expression:
        return True
    for match in _IDENT.finditer(expression):
        if match.group(0) not in array_names or expression[:match.start()].rstrip().endswith("."):
            continue
        rest = expression[match.end():].lstrip()
        if not rest.startswith("["):
            return True
        index = rest[1:_closing(rest, 0)]
        if _top_level(index, ":") or index.strip() in array_names:
            return True
    return False


#: Stan functions a transformed-data outcome's size may call, and how Python computes them.
_SIZE_FUNCTIONS: dict[str, Callable[..., int]] = {
    "size": lambda x: int(np.shape(x)[0]) if np.ndim(x) else 1, "num_elements": lambda x: int(np.size(x)),
    "rows": lambda x: int(np.shape(x)[0]), "cols": lambda x: int(np.shape(x)[1]), "max": max, "min": min}


def _transformed_outcome_rows(outcome: str, declared: str, data_names: set[str], where: str) -> str:
    """The size of an outcome declared in transformed data, read from its declaration: the number
    of its rows, which robustify's weights (declared in the data block) take. It must be an
    expression of the data block."""
    text = re.sub(r"<[^<>]*>", "", declared).strip()
    if text in ("real", "int"):
        return "1"
    match = re.match(r"(?:vector|row_vector|array|matrix)\[([^\[\]]*)\]", text)
    names = set(_IDENT.findall(match.group(1))) if match else set()
    if match is None or match.group(1).count(",") > 1 or not names <= data_names | set(_SIZE_FUNCTIONS):
        raise RobustifyError(f"{where}: the outcome {outcome!r} is declared in transformed data as `{declared}`; "
                             "robustify needs an outcome of one or two dimensions whose sizes are expressions of the "
                             f"data block (such as vector[N]), to declare its weights there (rs_weights_{outcome})")
    sizes = _split_top(match.group(1), ",")
    return sizes[0] if len(sizes) == 1 else f"({sizes[0]}) * ({sizes[1]})"


def transformed_outcome_size(rows: str, data: Mapping) -> int:
    """The number of rows of an outcome declared in transformed data, from its size expression
    (:attr:`Likelihood.rows`) and the data.

    Parameters
    ----------
    rows : str
        The size in Stan: integers, data-block names, ``+ - * / %/%`` and ``size``, ``num_elements``,
        ``rows``, ``cols``, ``max``, ``min``.
    data : mapping
        The data block's values by name.

    Returns
    -------
    int
        The size.

    Raises
    ------
    RobustStanInputError
        If the expression is not of that form or names a value ``data`` lacks.
    """
    operators = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
                 ast.FloorDiv: operator.floordiv}

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in data:
            return data[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            return operators[type(node.op)](int(value(node.left)), int(value(node.right)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -int(value(node.operand))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SIZE_FUNCTIONS:
            return _SIZE_FUNCTIONS[node.func.id](*(value(a) for a in node.args))
        raise RobustStanInputError(f"data: cannot compute the size `{rows}` of an outcome declared in transformed data "
                                   "from the data (is a variable missing?)")

    try:
        return int(value(ast.parse(rows.replace("%/%", "//"), mode="eval").body))
    except SyntaxError:
        raise RobustStanInputError(f"data: cannot read the size `{rows}` of an outcome declared in transformed "
                                   "data") from None


def _array_names(code: list[str]) -> set[str]:
    """Names declared anywhere in the program as one-dimensional arrays of reals or ints, or as row
    vectors (a name reused as a scalar elsewhere only costs an identity call). Read from the declarations: stanc's
    --info reports a vector and an array of reals alike."""
    names = set()
    for line in code:
        for match in re.finditer(r"\b(?:array\[[^\[\],]*\]\s*(?:real|int)\b(?:<[^<>]*>)?|row_vector(?:<[^<>]*>)?"
                                 r"\[[^\[\]]*\])\s+([A-Za-z]\w*)", line):
            names.add(match.group(1))
    return names


def _selection(outcome: str, kind: str, index: str | None, flattening: str | None = None):
    """How a statement on ``outcome`` (of declared ``kind``) indexed by ``index``, or read whole
    through ``flattening`` (``to_vector`` or ``to_array_1d``), picks its rows: (kind of the picked
    value, the picked value, weights -> the same rows of a weight vector, the slot of those rows in
    the per-observation vectors, pointwise losses of the picked value -> those rows' values, the rows
    as a Stan range or int array), or None when the indexing is not one of robustify's. A
    two-dimensional outcome's rows are flattened one after another (row-major, as NumPy's
    ``reshape(-1)``): element (i, j) is row (i - 1) * J + j. Stan's ``to_array_1d`` reads an array
    in that order, but ``to_vector`` and ``to_array_1d`` read a matrix column after column, so there
    the weights are reordered to the matrix's columns and the pointwise values back to its rows."""
    parts = _split_top(index, ",") if index else []
    two_dimensional = kind in _TWO_DIMENSIONAL_KINDS
    whole = f"1:num_elements({outcome})"
    if flattening is not None:
        if kind not in _FLATTENED_KINDS:
            return None
        element = f"{flattening}({outcome})"
        flat_kind = "vector" if flattening == "to_vector" else "int_array" if kind.startswith("int") else "real_array"
        if kind != "matrix":
            return flat_kind, element, (lambda w: w), "", (lambda p: p), whole
        height, width = f"rows({outcome})", f"cols({outcome})"
        return (flat_kind, element, (lambda w: f"to_vector(to_matrix({w}, {height}, {width}, 0))"), "",
                (lambda p: f"to_vector(to_matrix({p}, {height}, {width})')"), whole)
    if not parts:
        return None if two_dimensional else (kind, outcome, (lambda w: w), "", (lambda p: p), f"1:size({outcome})")
    if not two_dimensional:
        if len(parts) == 2:
            return None
        (part,) = parts
        first, last = _bounds(part, f"size({outcome})")
        rows = f"{first}:{last}"
        if not _top_level(part, ":"):  # one element, kept a container of one
            return kind, f"{outcome}[{rows}]", (lambda w: f"{w}[{rows}]"), f"[{first}]", _first_value, rows
        return kind, f"{outcome}[{rows}]", (lambda w: f"{w}[{rows}]"), f"[{rows}]", (lambda p: p), rows
    width, height = f"dims({outcome})[2]", f"dims({outcome})[1]"
    if len(parts) == 1:
        parts = [parts[0], ":"]  # y[i]: row i
    (row_first, row_last), (column_first, column_last) = _bounds(parts[0], height), _bounds(parts[1], width)
    if not any(_top_level(part, ":") for part in parts):
        flat = f"({row_first} - 1) * {width} + {column_first}"
        element_kind = "int" if kind == "int_array2" else "real"
        return (element_kind, f"{outcome}[{parts[0]}, {parts[1]}]", (lambda w: f"{w}[{flat}:{flat}]"), f"[{flat}]",
                _first_value, f"{flat}:{flat}")
    if not _top_level(parts[0], ":") and parts[1] == ":":  # a whole row: contiguous
        first, last = f"({row_first} - 1) * {width} + 1", f"{row_first} * {width}"
        row_kind = {"real_array2": "real_array", "int_array2": "int_array", "matrix": "row_vector"}[kind]
        return (row_kind, f"{outcome}[{parts[0]}]", (lambda w: f"segment({w}, {first}, {width})"),
                f"[{first}:{last}]", (lambda p: p), f"{first}:{last}")
    flat_rows = f"rs_flat_rows({row_first}, {row_last}, {column_first}, {column_last}, {width})"
    along_rows = _top_level(parts[0], ":")
    element_kind = {"real_array2": "real_array", "int_array2": "int_array",
                    "matrix": "vector" if along_rows else "row_vector"}[kind]
    element = f"{outcome}[{parts[0]}, {parts[1]}]" if parts[1] != ":" else f"{outcome}[{parts[0]}]"
    return element_kind, element, (lambda w: f"{w}[{flat_rows}]"), f"[{flat_rows}]", (lambda p: p), flat_rows


def _first_value(pointwise: str) -> str:
    """The one value of a pointwise loss over a single picked element."""
    return f"{pointwise}[1]"


def _bounds(part: str, size: str) -> tuple[str, str]:
    """(first, last) of one index: an element ``e`` (e, e) or a range ``lo:hi`` whose omitted
    bounds are 1 and ``size``."""
    if not _top_level(part, ":"):
        return part, part
    first, last = (piece.strip() for piece in part.split(":", 1)) if part.count(":") == 1 else ("", "")
    return first or "1", last or size


def _rewrite(statement: _Found, outcome: str, index: str | None, declared: str, source: str, used: set[int],
             filename: str, array_names: set[str], counted: bool) -> tuple[Likelihood, str, list[str]]:
    """The likelihood, its model-block line and its generated-quantities lines."""
    line = _user_line(source, statement, outcome, used)
    where = _describe(source, statement, line, filename)
    translation = _TRANSLATIONS.get(statement.distribution)
    if translation is None:
        supported = ", ".join(sorted(_TRANSLATIONS))
        raise RobustifyError(f"{where}: the family {statement.distribution!r} has no robust loss in robust-stan "
                             f"(supported: {supported})")
    if len(statement.arguments) != translation.arity:
        raise RobustifyError(f"{where}: {statement.distribution} takes {translation.arity} arguments here, found "
                             f"{len(statement.arguments)}")
    declared_kind = _outcome_kind(declared)
    flattening = _flattening(statement.outcome_text)
    selection = _selection(outcome, declared_kind, index, flattening[0] if flattening else None)
    if selection is None and flattening:
        raise RobustifyError(f"{where}: the outcome {outcome!r} is declared `{declared}`; robustify reads an outcome "
                             f"through {flattening[0]} when it is a vector, a row_vector, an array of one or two "
                             "dimensions of reals or ints, or a matrix (each element an observation)")
    if selection is None:
        raise RobustifyError(f"{where}: the outcome {outcome!r} is declared `{declared}` and indexed "
                             f"{'by `' + index + '`' if index else 'not at all'}; robustify takes a one-dimensional "
                             "outcome whole or one element per loop iteration, and a two-dimensional one by element "
                             "y[i, j] or by row y[i] (it is not a density's outcome whole)")
    kind, element, weights_of, slot, pick, rows_taken = selection
    if flattening and translation.outcome == "vector_array":  # the flattened values are one observation
        weights_of, pick = (lambda w: w), (lambda p: p)
    outcome_expression = {
        ("vector", "vector"): element,
        ("vector", "row_vector"): f"({element})'",
        ("vector", "real_array"): f"to_vector({element})",
        ("vector", "int_array"): f"to_vector({element})",
        ("vector", "real"): f"[{element}]'",
        ("vector", "int"): f"[{element}]'",
        ("int_array", "int_array"): element,
        ("int_array", "int"): f"{{{element}}}",
        ("vector_array", "vector_array"): element,
        ("vector_array", "vector"): f"{{{element}}}",  # one multivariate observation
    }.get((translation.outcome, kind))
    if outcome_expression is None:
        wants = {"vector": "a real or a vector, row_vector or one-dimensional array", "int_array":
                 "an int or a one-dimensional int array", "vector_array": "an array of vectors"}[translation.outcome]
        raise RobustifyError(f"{where}: the outcome {outcome!r} is declared `{declared}`; the {statement.distribution} "
                             f"likelihood needs {wants}")
    composed = translation.rewrite != ", ".join(f"{{{i}}}" for i in range(translation.arity))
    arguments = translation.rewrite.format(*(map(_atom, statement.arguments) if composed else statement.arguments))
    arguments = _as_library_arguments(arguments, translation.family, array_names)
    if family_of_stan_name(translation.family).args[0].data_only:  # the library takes one trials count per row
        trials, *rest = _split_top(arguments, ",")
        arguments = ", ".join([f"rs_trials({trials}, size({outcome_expression}))", *rest])
    suffix = "lpmf" if translation.outcome in _DISCRETE else "lpdf"
    weights = weights_of(f"rs_weights_{outcome}")
    function = f"robust_{translation.family}"
    table = f", {_table_name(translation.family)}" if translation.family in _TABLED_FAMILIES else ""
    weight_parameters = weights_of(f"{WEIGHT_PARAMETERS}{outcome}")
    call = (f"rs_learning_rate * {function}_weighted_{suffix}({outcome_expression} | {arguments}, "
            f"rs_divergence, rs_divergence_param, <weights>{table})")
    # a two-dimensional outcome's rows are its elements; a vector of a multivariate family is one row
    rows = f"num_elements({outcome})" if declared_kind in _TWO_DIMENSIONAL_KINDS else None
    if translation.outcome == "vector_array" and kind == "vector":
        if index:
            raise RobustifyError(f"{where}: a multivariate outcome declared `{declared}` is one observation; "
                                 "robustify takes it whole")
        rows = "1"
    likelihood = Likelihood(outcome, statement.distribution, translation.family, index, line, statement.statement,
                            rows)
    with_data_weights = f"target += {call.replace('<weights>', weights)};"
    if likelihood.native:  # beta and gamma by the C++ loss and its closed-form gradient
        with_data_weights = (f"if (rs_divergence == 1 || rs_divergence == 2)\n"
                             f"  target += -rs_learning_rate * rs_native_{translation.family}_total_loss("
                             f"{outcome_expression}, {arguments}, {weights}, rs_divergence, rs_divergence_param{table});\n"
                             f"else\n  {with_data_weights}")
    # the weights as parameters only serve robust-stan's per-example gradients (gradients/weight_derivatives.py)
    model_line = (f"if (rs_weights_are_parameters) target += {call.replace('<weights>', weight_parameters)};\n"
                  f"else {with_data_weights}  // robustified: {statement.statement}")
    if counted:
        first, _, last = rows_taken.partition(":")
        count = (f"{_counter(outcome)}[{first}] += 1;" if first == last and "rs_flat_rows" not in rows_taken
                 else f"for (rs_row in {rows_taken}) {_counter(outcome)}[rs_row] += 1;")
        model_line = f"{count}\n{model_line}"
    log_lik = pick(f"{function}_pointwise_loss({outcome_expression}, {arguments}, 0, 1)")
    robust_loss = pick(f"{function}_pointwise_loss({outcome_expression}, {arguments}, rs_divergence, "
                       f"rs_divergence_param{table})")
    gq_lines = [f"rs_log_lik_{outcome}{slot} = -{log_lik};", f"rs_robust_loss_{outcome}{slot} = {robust_loss};"]
    return likelihood, model_line, gq_lines


def _assemble(lines: list[str], code: list[str], model: tuple[int, int], likelihoods: list[Likelihood],
              rewritten: dict[int, list[str]], pointwise: dict[int, list[str]], filename: str,
              counted: set[str]) -> str:
    """The whole rewritten program: library include, switches in the data block, the model block's
    likelihood lines replaced, the per-observation quantities first in generated quantities."""
    for k in range(model[0] + 1, model[1]):
        if re.search(r"\btarget\s*\(\s*\)|\b\w+_lp\s*\(", code[k]):
            raise RobustifyError(f"{filename}: `{code[k].strip()}` reads target() or calls an _lp function, which the "
                                 "generated quantities (where robustify computes log_lik) cannot do")
    functions, data, parameters = _block(code, "functions"), _block(code, "data"), _block(code, "parameters")
    transformed_data, gq = _block(code, "transformed data"), _block(code, "generated quantities")
    assert data is not None, "a likelihood's outcome is declared in the data block"
    per_row = [lik for lik in likelihoods if not lik.vectorised]
    added_transformed_data = (_gamma_original_guard(per_row) if per_row else []) + _integral_tables(likelihoods)
    first_block = next(k for k, line in enumerate(code) if re.match(r"[a-z]", line))
    replay = _pointwise_block(lines, code, model, likelihoods, pointwise)
    includes = [f"  #include {LIBRARY_FILE}"] + ([f"  #include {NATIVE_FILE}"] if any(lik.native for lik in likelihoods)
                                                 else [])
    counting = _row_counting([(lik.outcome, lik.rows or f"size({lik.outcome})")
                              for lik in first_per_outcome(likelihoods) if lik.outcome in counted])
    out = []
    for k, line in enumerate(lines):
        if k == model[1] and counting:
            out += counting[1]
        if k == first_block and not functions:
            out += ["functions {", *includes, "}"]
        if k == data[1]:
            out += _switch_declarations(likelihoods)
        if parameters and k == parameters[1]:
            out += _weight_parameters(likelihoods)
        if k in rewritten:
            indent = line[:len(line) - len(line.lstrip())]
            text = "\n".join(rewritten[k])
            out.append((indent + text.replace("\n", "\n" + indent) + " " + _comment_part(line, code[k])).rstrip())
        else:
            out.append(line)
        if functions and k == functions[0]:
            out += includes
        if k == model[0] and counting:
            out += counting[0]
        if added_transformed_data and transformed_data and k == transformed_data[1] - 1:
            out += added_transformed_data
        if added_transformed_data and not transformed_data and k == data[1]:
            out += ["transformed data {", *added_transformed_data, "}"]
        if gq and k == gq[0]:
            out += replay
    if not gq:
        out += ["generated quantities {", *replay, "}"]
    return "\n".join(out) + "\n"


def _comment_part(line: str, code_line: str) -> str:
    """The comment text of a line (what comment blanking removed), kept where a statement goes."""
    return "".join(c if blank == " " else " " for c, blank in zip(line, code_line)).strip()


def _switch_declarations(likelihoods: list[Likelihood]) -> list[str]:
    lines = ["  // robust-stan switches (added by robustify): chosen per fit, without recompiling",
             "  int<lower=0, upper=3> rs_divergence;  // 0 KL, 1 beta, 2 gamma, 3 gamma (original form)",
             "  real<lower=0> rs_divergence_param;    // beta or gamma; ignored for KL",
             "  real<lower=0> rs_learning_rate;       // w"]
    for lik in first_per_outcome(likelihoods):
        size = lik.rows or f"size({lik.outcome})"  # an outcome of transformed data is not declared yet here
        lines.append(f"  vector<lower=0>[{size}] rs_weights_{lik.outcome};  // v_i of {lik.outcome}")
    lines.append("  int<lower=0, upper=1> rs_pointwise;     // 1: rs_log_lik_* and rs_robust_loss_* filled")
    lines.append("  int<lower=0, upper=1> rs_weights_are_parameters;  // 1: weights from rs_weight_parameters_* "
                 "(per-example gradients)")
    return lines


def _weight_parameters(likelihoods: list[Likelihood]) -> list[str]:
    return ["  // added by robustify: the weights as parameters, for robust-stan's per-example gradients only",
            *(f"  vector[rs_weights_are_parameters ? {lik.rows or f'size({lik.outcome})'} : 0] "
              f"{WEIGHT_PARAMETERS}{lik.outcome};"
              for lik in first_per_outcome(likelihoods))]


def _counter(outcome: str) -> str:
    return f"rs_times_counted_{outcome}"


def _row_counting(outcomes: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(first lines, last lines) of the model block that count how often each row of these outcomes
    (taken by indexes, slices or several statements) enters the likelihood, and reject the data when a
    row enters twice (its weight would count twice)."""
    first = [f"  array[{size}] int {_counter(y)} = rep_array(0, {size});  // added by robustify: rows counted"
             for y, size in outcomes]
    last = [f"  if (max({_counter(y)}) > 1) reject(\"robust-stan: the likelihood statements take row \", "
            f"sort_indices_desc({_counter(y)})[1], \" of {y} more than once; robustify needs each row in one "
            f"statement\");" for y, _ in outcomes]
    return first, last


def first_per_outcome(likelihoods) -> list[Likelihood]:
    """The first likelihood statement of each outcome, in order (an outcome's several statements share
    its switches, weights and size).

    Parameters
    ----------
    likelihoods : iterable of Likelihood
        A program's likelihood statements.

    Returns
    -------
    list of Likelihood
        One per outcome.
    """
    first: dict[str, Likelihood] = {}
    for lik in likelihoods:
        first.setdefault(lik.outcome, lik)
    return list(first.values())


def _table_name(family: str) -> str:
    return f"rs_integral_table_{family}"


def _integral_tables(likelihoods: list[Likelihood]) -> list[str]:
    """The library's tables of log I_a (its fast path) for the families that have one, built once."""
    out = []
    for family in sorted({lik.family for lik in likelihoods} & _TABLED_FAMILIES):
        a = "rs_divergence == 0 ? 0 : rs_divergence_param"
        out.append(f"  matrix[robust_{family}_integral_table_rows({a}), 5] {_table_name(family)} "
                   f"= robust_{family}_integral_table({a});  // added by robustify: log I_a tabled once")
    return out


def _gamma_original_guard(per_row: list[Likelihood]) -> list[str]:
    names = ", ".join(lik.outcome for lik in per_row)
    return ["  if (rs_divergence == 3)",
            f'    reject("robust-stan: the likelihood of {names} is written one observation at a time, and the '
            'original gamma form is not a sum over observations; use KL, beta or gamma (decomposable)");']


def _pointwise_block(lines: list[str], code: list[str], model: tuple[int, int], likelihoods: list[Likelihood],
                     pointwise: dict[int, list[str]]) -> list[str]:
    """Declarations of the per-observation quantities and the model block replayed to fill them
    (priors and target increments left out, their comments kept), inside its own scope so its
    names end there."""
    out = ["  // robust-stan (added by robustify): per observation, filled when rs_pointwise = 1"]
    for lik in first_per_outcome(likelihoods):
        size = f"rs_pointwise ? {lik.rows or f'size({lik.outcome})'} : 0"
        out += [f"  vector[{size}] rs_log_lik_{lik.outcome};      // log p({lik.outcome}_i | theta)",
                f"  vector[{size}] rs_robust_loss_{lik.outcome};  // l_i(theta) under the chosen divergence"]
    out.append("  if (rs_pointwise) {")
    for k in range(model[0] + 1, model[1]):
        indent = "  " + lines[k][:len(lines[k]) - len(lines[k].lstrip())]
        if k in pointwise:
            out += [indent + text for text in pointwise[k]]
        elif _statements_on(code[k]) or code[k].strip().startswith("target +="):
            comment = _comment_part(lines[k], code[k])  # priors and other increments of the target are left out
            if comment:
                out.append(indent + comment)
        else:
            out.append("  " + lines[k])
    out.append("  }")
    return out
