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

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..common.errors import RobustStanInputError
from ..common.resources import LIBRARY_FILE, NATIVE_FILE
from .families import FAMILIES

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
}
_DISCRETE = {"int_array"}
_TABLED_FAMILIES = {family.stan_name for family in FAMILIES.values() if family.integral_table}
#: Families whose beta and gamma losses have a native (C++) version, used for vectorised statements.
_NATIVE_FAMILIES = {family.stan_name for family in FAMILIES.values() if family.native}
_IDENT = re.compile(r"[A-Za-z]\w*")
_DECLARATION = re.compile(r"^\s*(?P<type>[a-z_]+(\[[^\]]*\])?(\s+[a-z_]+(\[[^\]]*\])?)?)\s+(?P<names>[A-Za-z]\w*.*);")
_TARGET_TERM = r"\b\w+_(lpdf|lupdf|lpmf|lupmf|lcdf|lccdf|cdf)\s*\(\s*{name}\b"


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

    @property
    def vectorised(self) -> bool:
        return self.index is None

    @property
    def native(self) -> bool:
        """Whether its beta and gamma losses go through the native loss (robust_stan_native.hpp)."""
        return self.vectorised and self.family in _NATIVE_FAMILIES


@dataclass(frozen=True)
class RobustifiedProgram:
    """The rewritten program and what it rewrote."""

    stan_code: str
    likelihoods: tuple[Likelihood, ...]

    @property
    def outcomes(self) -> list[str]:
        return [lik.outcome for lik in self.likelihoods]


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


def _outcome_kind(type_text: str) -> str:
    """The shape class of a data declaration: vector, row_vector, real_array, int_array,
    vector_array, or other."""
    text = re.sub(r"<[^<>]*>", "", type_text).strip()
    if text.startswith("vector"):
        return "vector"
    if text.startswith("row_vector"):
        return "row_vector"
    match = re.match(r"array\[([^\]]*)\]\s*(\w+)", text)
    if match and "," not in match.group(1):
        return {"real": "real_array", "int": "int_array", "vector": "vector_array"}.get(match.group(2), "other")
    return "other"


# -- finding the likelihood statements -------------------------------------------------------
@dataclass
class _Found:
    line_index: int       # in the canonical lines
    outcome_text: str
    distribution: str
    arguments: list[str]
    truncated: bool
    whole_statement: bool  # False: a *_lpdf call inside a larger expression
    statement: str


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
        for match in re.finditer(r"\b(\w+)_(lpdf|lupdf|lpmf|lupmf)\s*\(", expression):
            close = _closing(expression, match.end() - 1)
            inside = expression[match.end():close]
            pieces = _split_top(inside, "|")
            if len(pieces) != 2:
                continue
            arguments = [a for a in _split_top(pieces[1], ",") if a]
            whole = match.start() == 0 and close == len(expression) - 1
            found.append(_Found(line_index, pieces[0], match.group(1), arguments, False, whole, statement))
    return found


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
    """The data variables that are the outcome of a distribution statement of the model block
    (``y ~ ...``, ``y[n] ~ ...``, ``target += *_lpdf(y | ...)``), in order of appearance: what
    :func:`robust_stan.from_stan` reports as observed data. Nothing is refused here."""
    code = _without_comments(canonical.splitlines())
    model = _block(code, "model")
    outcomes: list[str] = []
    for k in range(model[0] + 1, model[1]) if model else ():
        for statement in _statements_on(code[k], k):
            match = re.fullmatch(r"([A-Za-z]\w*)\s*(\[.*\])?", statement.outcome_text.strip())
            if match and match.group(1) in info["inputs"] and match.group(1) not in outcomes:
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
    lines = canonical.splitlines()
    code = _without_comments(lines)
    data_names = set(info["inputs"])
    model = _block(code, "model")
    if model is None:
        raise RobustifyError(f"{filename}: the program has no model block, so there is no likelihood to robustify")
    data_types = _declarations(code, _block(code, "data"))
    transformed_data = set(_declarations(code, _block(code, "transformed data")))
    used_names = data_names | transformed_data | set(info["parameters"]) | set(info["transformed parameters"]) \
        | set(info["generated quantities"])
    clash = sorted(n for n in used_names if n in SWITCHES or n.startswith(("rs_weights_", "rs_log_lik_",
                                                                            "rs_robust_loss_", WEIGHT_PARAMETERS)))
    if clash:
        raise RobustifyError(f"{filename}: the program already uses the name(s) {clash}, which robustify adds; "
                             "rename them")
    wanted = _wanted_outcomes(likelihood, data_names, filename,
                              lambda: _statements_on_non_data(code, model, info, source, filename))

    found: list[tuple[_Found, str, str | None]] = []
    for k in range(model[0] + 1, model[1]):
        for statement in _statements_on(code[k], k):
            target = _classify(statement, data_names, transformed_data, wanted, source, filename)
            if target is not None:
                found.append((statement, *target))
    outcomes = [outcome for _, outcome, _ in found]
    for outcome in sorted(set(outcomes)):
        if outcomes.count(outcome) > 1:
            used: set[int] = set()
            where = [_where(source, s, outcome, used, filename) for s, o, _ in found if o == outcome]
            raise RobustifyError(f"{'; '.join(where)}: several likelihood statements on the outcome {outcome!r}; "
                                 "robustify needs all of its likelihood in one statement")
    _refuse_other_terms_on(outcomes, found, code, model, source, filename)
    if wanted is not None:
        missing = sorted(set(wanted) - set(outcomes))
        if missing:
            raise RobustifyError(f"{filename}: likelihood={likelihood!r}: no `~` or `target += *_lpdf` statement "
                                 f"on {missing} in the model block")
    if not found:
        not_data = _statements_on_non_data(code, model, info, source, filename)
        raise RobustifyError(f"{filename}: found no likelihood statement (a `~` or `target += *_lpdf(...)` statement "
                             "whose outcome is a variable of the data block)"
                             + "".join(f"; {where}: {why}" for _, where, why in not_data))

    likelihoods, rewritten, pointwise = [], {}, {}
    used_lines: set[int] = set()
    for statement, outcome, index in found:
        lik, model_line, gq_lines = _rewrite(statement, outcome, index, data_types[outcome], source, used_lines,
                                             filename)
        likelihoods.append(lik)
        rewritten[statement.line_index] = model_line
        pointwise[statement.line_index] = gq_lines
    return RobustifiedProgram(_assemble(lines, code, model, likelihoods, rewritten, pointwise, filename),
                              tuple(likelihoods))


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
            names = _IDENT.findall(statement.outcome_text)
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


def _classify(statement: _Found, data_names: set[str], transformed_data: set[str], wanted: list[str] | None,
              source: str, filename: str) -> tuple[str, str | None] | None:
    """(outcome, loop index) for a likelihood statement, None for any other statement, or an error."""
    text = statement.outcome_text
    identifiers = _IDENT.findall(text)
    base = identifiers[0] if identifiers else ""
    match = re.fullmatch(r"([A-Za-z]\w*)\s*(\[(?P<index>.*)\])?", text)
    unindexed = text
    while re.search(r"\[[^\[\]]*\]", unindexed):  # names inside indexes (x[2:T]) are not the outcome
        unindexed = re.sub(r"\[[^\[\]]*\]", "", unindexed)
    on_data = [n for n in _IDENT.findall(unindexed) if n in data_names]
    if match and base in transformed_data and (wanted is None or base in wanted):
        raise RobustifyError(f"{_where(source, statement, base, set(), filename)}: the outcome {base!r} is a "
                             "transformed data variable; robustify rewrites likelihoods of data-block variables "
                             "(declare it in the data block, or write the likelihood on the original data)")
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
                             "rewrites a term only when it is the whole statement, "
                             f"`target += {statement.distribution}_lpdf({base} | ...);` (a mixture such as log_mix "
                             "has no robust loss in robust-stan)")
    if statement.truncated:
        raise RobustifyError(f"{where}: truncation T[,] is not supported (the robust loss of a truncated "
                             "distribution needs its own integral term)")
    index = match.group("index")
    if index is not None:
        index = index.strip()
        if not re.fullmatch(r"[A-Za-z]\w*", index) or index in data_names or index in transformed_data:
            raise RobustifyError(f"{where}: {base!r} is indexed by `{index}`, so its observations cannot be told "
                                 "apart (robustify takes the whole variable, or one element per loop iteration, "
                                 "y[n] inside `for (n in ...)`)")
    return base, index


def _rewrite(statement: _Found, outcome: str, index: str | None, declared: str, source: str, used: set[int],
             filename: str) -> tuple[Likelihood, str, list[str]]:
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
    kind = _outcome_kind(declared)
    element = f"{outcome}[{index}:{index}]" if index else outcome
    outcome_expression = {
        ("vector", "vector"): element,
        ("vector", "row_vector"): f"({element})'",
        ("vector", "real_array"): f"to_vector({element})",
        ("int_array", "int_array"): element,
        ("vector_array", "vector_array"): element,
    }.get((translation.outcome, kind))
    if outcome_expression is None:
        wants = {"vector": "a vector, row_vector or one-dimensional real array", "int_array":
                 "a one-dimensional int array", "vector_array": "an array of vectors"}[translation.outcome]
        raise RobustifyError(f"{where}: the outcome {outcome!r} is declared `{declared}`; the {statement.distribution} "
                             f"likelihood needs {wants}")
    composed = translation.rewrite != ", ".join(f"{{{i}}}" for i in range(translation.arity))
    arguments = translation.rewrite.format(*(map(_atom, statement.arguments) if composed else statement.arguments))
    if index and translation.family == "binomial_logit":  # the library takes the trials as an array
        trials, *rest = _split_top(arguments, ",")
        arguments = ", ".join([f"{{{trials}}}", *rest])
    suffix = "lpmf" if translation.outcome in _DISCRETE else "lpdf"
    weights = f"rs_weights_{outcome}[{index}:{index}]" if index else f"rs_weights_{outcome}"
    function = f"robust_{translation.family}"
    table = f", {_table_name(translation.family)}" if translation.family in _TABLED_FAMILIES else ""
    weight_parameters = f"{WEIGHT_PARAMETERS}{outcome}[{index}:{index}]" if index else f"{WEIGHT_PARAMETERS}{outcome}"
    call = (f"rs_learning_rate * {function}_weighted_{suffix}({outcome_expression} | {arguments}, "
            f"rs_divergence, rs_divergence_param, {{}}{table})")
    likelihood = Likelihood(outcome, statement.distribution, translation.family, index, line, statement.statement)
    with_data_weights = f"target += {call.format(weights)};"
    if likelihood.native:  # beta and gamma by the C++ loss and its closed-form gradient
        with_data_weights = (f"if (rs_divergence == 1 || rs_divergence == 2)\n"
                             f"  target += -rs_learning_rate * rs_native_{translation.family}_total_loss("
                             f"{outcome_expression}, {arguments}, {weights}, rs_divergence, rs_divergence_param{table});\n"
                             f"else\n  {with_data_weights}")
    # the weights as parameters only serve robust-stan's per-example gradients (gradients/weight_derivatives.py)
    model_line = (f"if (rs_weights_are_parameters) target += {call.format(weight_parameters)};\n"
                  f"else {with_data_weights}  // robustified: {statement.statement}")
    pick = "[1]" if index else ""
    slot = f"[{index}]" if index else ""
    gq_lines = [f"rs_log_lik_{outcome}{slot} = -{function}_pointwise_loss({outcome_expression}, {arguments}, 0, 1){pick};",
                f"rs_robust_loss_{outcome}{slot} = {function}_pointwise_loss({outcome_expression}, {arguments}, "
                f"rs_divergence, rs_divergence_param{table}){pick};"]
    return likelihood, model_line, gq_lines


def _assemble(lines: list[str], code: list[str], model: tuple[int, int], likelihoods: list[Likelihood],
              rewritten: dict[int, str], pointwise: dict[int, list[str]], filename: str) -> str:
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
    out = []
    for k, line in enumerate(lines):
        if k == first_block and not functions:
            out += ["functions {", *includes, "}"]
        if k == data[1]:
            out += _switch_declarations(likelihoods)
        if parameters and k == parameters[1]:
            out += _weight_parameters(likelihoods)
        if k in rewritten:
            indent = line[:len(line) - len(line.lstrip())]
            out.append((indent + rewritten[k].replace("\n", "\n" + indent) + " " + _comment_part(line, code[k])).rstrip())
        else:
            out.append(line)
        if functions and k == functions[0]:
            out += includes
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
    for lik in likelihoods:
        lines.append(f"  vector<lower=0>[size({lik.outcome})] rs_weights_{lik.outcome};  // v_i of {lik.outcome}")
    lines.append("  int<lower=0, upper=1> rs_pointwise;     // 1: rs_log_lik_* and rs_robust_loss_* filled")
    lines.append("  int<lower=0, upper=1> rs_weights_are_parameters;  // 1: weights from rs_weight_parameters_* "
                 "(per-example gradients)")
    return lines


def _weight_parameters(likelihoods: list[Likelihood]) -> list[str]:
    return ["  // added by robustify: the weights as parameters, for robust-stan's per-example gradients only",
            *(f"  vector[rs_weights_are_parameters ? size({lik.outcome}) : 0] {WEIGHT_PARAMETERS}{lik.outcome};"
              for lik in likelihoods)]


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
    for lik in likelihoods:
        size = f"rs_pointwise ? size({lik.outcome}) : 0"
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
