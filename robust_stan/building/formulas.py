"""Wilkinson formulas and a data frame made the arrays of a regression: outcome, design matrix,
column names and group-level terms, with the training data's encoding kept for new data.

The population-level part of a formula (``y ~ x1 + C(g) + x1:x2 + np.log(x2)``) is formulaic's:
its parser, its column names (``C(g)[T.b]``, ``x1:x2``) and its encodings (treatment contrasts,
stateful transforms such as ``center(x)``), kept in formulaic's ``ModelSpec`` so that new rows
get the same columns. Group-level terms, which formulaic has no syntax for, are read here in
lme4's and brms' notation and each side handed to formulaic:

- ``(1 | g)``: an intercept per level of ``g``;
- ``(x | g)`` (the same as ``(1 + x | g)``): an intercept and a slope per level, correlated;
- ``(0 + x | g)``: a slope only;
- ``(x || g)``: an intercept and a slope per level, uncorrelated;
- ``(1 | g1) + (1 | g2)``: one term per grouping factor; ``(1 | g1:g2)`` groups by the pairs of
  levels and ``(1 | g1/g2)`` is ``(1 | g1) + (1 | g1:g2)``.

The population-level intercept is not a column of the design matrix: the models have their own
(``alpha``), and :attr:`Design.intercept` says whether the formula has one (``0 +`` or ``- 1``
remove it). Rows with a missing value in a column the formula reads are refused, naming the rows.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from ..common.errors import RobustStanInputError

#: The name of an intercept column: formulaic's, and brms' name of a group-level intercept.
INTERCEPT = "Intercept"

#: What :meth:`FormulaEncoding.design` does with a level of a grouping factor that the training data
#: did not have: refuse it, or give it an index past the fitted levels (:attr:`GroupTerm.new_rows`).
NEW_LEVELS = ("error", "flag")

_OPENING, _CLOSING = "([{", ")]}"
_NAME = re.compile(r"^(?:[A-Za-z_.][A-Za-z0-9_.]*|`[^`]+`)$")
_SHOWN_ROWS = 10


# -- reading the formula ---------------------------------------------------------------------------

def _top_level(text: str):
    """(position, character, depth) of every character of ``text`` outside quotes, with the depth
    of brackets before it; a character inside quotes or backticks is left out."""
    depth, quote = 0, ""
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
            continue
        if char in "'\"`":
            quote = char
            continue
        if char in _CLOSING:
            depth -= 1
        yield i, char, depth
        if char in _OPENING:
            depth += 1
        if depth < 0:
            raise RobustStanInputError(f"formula: unbalanced brackets in {text!r}")
    if depth or quote:
        raise RobustStanInputError(f"formula: unbalanced brackets or quotes in {text!r}")


def _split_once(text: str, separator: str) -> tuple[str, str] | None:
    """``text`` split at the first ``separator`` outside brackets and quotes, or None."""
    for i, _, depth in _top_level(text):
        if depth == 0 and text.startswith(separator, i):
            return text[:i], text[i + len(separator):]
    return None


@dataclass(frozen=True)
class GroupTermFormula:
    """One group-level term as written, ``(expression | factor)`` or ``(expression || factor)``.

    Parameters
    ----------
    text : str
        The term as written, e.g. ``"(1 + x | g)"``.
    expression : str
        The formula of the varying coefficients, e.g. ``"1 + x"`` (an intercept unless ``0 +``).
    factor : str
        The grouping factor: a column name, or names joined by ``:`` (the pairs of their levels).
    correlated : bool
        Whether the coefficients of one level are correlated (``|``) or independent (``||``).
    """

    text: str
    expression: str
    factor: str
    correlated: bool

    @property
    def factor_columns(self) -> tuple[str, ...]:
        """The data columns of the grouping factor (tuple of str)."""
        return tuple(part.strip().strip("`") for part in self.factor.split(":"))


@dataclass(frozen=True)
class ParsedFormula:
    """A formula split into its outcome, its population-level part and its group-level terms.

    Parameters
    ----------
    text : str
        The formula as written.
    outcome : str or None
        The left-hand side (None for a one-sided formula, ``"~ x"``).
    fixed : str
        The right-hand side without the group-level terms, for formulaic (``"1"`` when nothing is left).
    groups : tuple of GroupTermFormula
        The group-level terms, in the order written (``g1/g2`` expanded).
    trials : str or None, default None
        The column of a binomial outcome's numbers of trials, from ``y | trials(n) ~ ...`` (brms'
        notation); None when the outcome has none.
    """

    text: str
    outcome: str | None
    fixed: str
    groups: tuple[GroupTermFormula, ...]
    trials: str | None = None

    @property
    def intercept(self) -> bool:
        """Whether the population-level part has an intercept (bool; read by formulaic without data,
        so that a program can be generated before the data are seen)."""
        import formulaic

        try:
            terms = [str(term) for term in formulaic.Formula(self.fixed)]
        except Exception as err:  # formulaic's parse errors
            raise RobustStanInputError(f"formula: formulaic cannot read {self.fixed!r}: {_plain(err)}") from None
        return "1" in terms

    @property
    def group_stan_names(self) -> tuple[str, ...]:
        """A Stan identifier per group-level term, unique in the formula (``g1:g2`` is ``g1_g2``)."""
        return tuple(_stan_names([term.factor for term in self.groups]))


def _group_terms(text: str) -> list[tuple[int, int, str]]:
    """(start, end, inner text) of every bracketed term at the top level of ``text`` whose inside
    has a ``|`` at its own top level; a bracket after a name is a call, not a term."""
    found, start = [], None
    for i, char, depth in _top_level(text):
        if char == "(" and depth == 0:
            before = text[:i].rstrip()
            start = None if before and (before[-1].isalnum() or before[-1] in "_.]`") else i
        elif char == ")" and depth == 0 and start is not None:
            inner = text[start + 1:i]
            if _split_once(inner, "|") is not None:
                found.append((start, i + 1, inner))
            start = None
    return found


def _remove_terms(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` without the spans, each with the ``+`` that joins it to the rest."""
    for start, end, _ in reversed(spans):
        before, after = text[:start].rstrip(), text[end:].lstrip()
        if before.endswith("+"):
            before = before[:-1]
        elif after.startswith("+"):
            after = after[1:]
        elif before or after:
            joined = before[-1:] if before else after[:1]
            raise RobustStanInputError(f"formula: a group-level term {text[start:end]!r} can only be added "
                                       f"('+ (1 | g)'), not joined by {joined!r}")
        text = f"{before} {after}"
    return text.strip()


def _factor_terms(term: str, inner: str) -> list[GroupTermFormula]:
    """The group-level terms of one bracketed term: one, or two for a nested factor ``g1/g2``."""
    double = _split_once(inner, "||")
    sides = double or _split_once(inner, "|")
    assert sides is not None  # _group_terms takes only terms with a '|'
    expression, factor = (side.strip() for side in sides)
    if not expression:
        raise RobustStanInputError(f"formula: {term!r} has nothing left of '|'; write (1 | g) for an intercept")
    parts = [part.strip() for part in factor.split("/")]
    for part in parts:
        if not all(_NAME.match(name.strip()) for name in part.split(":")):
            raise RobustStanInputError(f"formula: the grouping factor of {term!r} must be column names joined by ':' "
                                       f"or '/', got {factor!r}")
    nested = [":".join(parts[:k + 1]) for k in range(len(parts))]  # g1/g2 -> g1, g1:g2
    return [GroupTermFormula(term, expression, name, double is None) for name in nested]


def parse_formula(formula: str) -> ParsedFormula:
    """Split a formula into its outcome, population-level part and group-level terms.

    Parameters
    ----------
    formula : str
        A Wilkinson formula, e.g. ``"y ~ x1 + C(g) + (1 + x1 | school)"``.

    Returns
    -------
    ParsedFormula
        The parts; the population-level part is not checked here (formulaic reads it later).

    Raises
    ------
    RobustStanInputError
        If the formula is not a string with one ``~``, a group-level term is not added to the rest,
        or a grouping factor is not a column name or names joined by ``:`` or ``/``.
    """
    if not isinstance(formula, str) or not formula.strip():
        raise RobustStanInputError(f"formula: expected a formula such as 'y ~ x1 + x2', got {formula!r}")
    sides = _split_once(formula, "~")
    if sides is None:
        raise RobustStanInputError(f"formula: no '~' in {formula!r}; write it as 'y ~ x1 + x2'")
    lhs, rhs = sides
    if _split_once(rhs, "~") is not None:
        raise RobustStanInputError(f"formula: more than one '~' in {formula!r}")
    lhs, trials = _outcome_and_trials(lhs, formula)
    spans = _group_terms(rhs)
    groups = [term for start, end, inner in spans for term in _factor_terms(rhs[start:end], inner)]
    seen: dict[str, str] = {}
    for term in groups:
        if term.factor in seen:
            raise RobustStanInputError(
                f"formula: the grouping factor {term.factor!r} appears in {seen[term.factor]!r} and {term.text!r}; "
                f"give its varying coefficients in one term, (1 + x | {term.factor}) for correlated ones or "
                f"(1 + x || {term.factor}) for independent ones")
        seen[term.factor] = term.text
    fixed = _remove_terms(rhs, spans)
    return ParsedFormula(formula, lhs.strip() or None, fixed or "1", tuple(groups), trials)


_TRIALS = re.compile(r"^trials\(\s*(?P<name>[A-Za-z_.][A-Za-z0-9_.]*|`[^`]+`)\s*\)$")


def _outcome_and_trials(lhs: str, formula: str) -> tuple[str, str | None]:
    """The outcome and, from ``y | trials(n)``, the column of the numbers of trials."""
    sides = _split_once(lhs, "|")
    if sides is None:
        return lhs, None
    outcome, addition = (side.strip() for side in sides)
    match = _TRIALS.match(addition)
    if not outcome or match is None:
        raise RobustStanInputError(f"formula: the outcome of {formula!r} can only be followed by '| trials(n)' (a "
                                   f"binomial outcome's numbers of trials, the column n), got {addition!r}")
    return outcome, match["name"].strip("`")


# -- checks of the data ----------------------------------------------------------------------------

def _row_list(labels) -> str:
    labels = list(labels)
    shown = ", ".join(str(label) for label in labels[:_SHOWN_ROWS])
    return shown + (f" and {len(labels) - _SHOWN_ROWS} more" if len(labels) > _SHOWN_ROWS else "")


def _as_frame(data, argument: str) -> pd.DataFrame:
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, Mapping):
        try:
            return pd.DataFrame({name: data[name] for name in data})
        except ValueError as err:
            raise RobustStanInputError(f"{argument}: the columns must have one length ({err})") from None
    raise RobustStanInputError(f"{argument}: a formula needs a pandas DataFrame (or a dict of columns), "
                               f"got {type(data).__name__}")


def _require_columns(frame: pd.DataFrame, names, argument: str, where: str) -> None:
    missing = sorted(str(name) for name in names if name not in frame.columns)
    if missing:
        raise RobustStanInputError(f"{argument}: {where} reads the column(s) {missing}, which {argument} does not have "
                                   f"(its columns: {[str(c) for c in frame.columns]})")


def _refuse_missing(frame: pd.DataFrame, names, argument: str) -> None:
    """A RobustStanInputError naming the rows (index labels) of ``frame`` with a missing value in
    one of the columns ``names``."""
    names = [name for name in frame.columns if name in set(names)]
    missing = frame[names].isna()
    if missing.to_numpy().any():
        columns = [str(name) for name in names if missing[name].any()]
        rows = frame.index[missing.any(axis=1).to_numpy()]
        raise RobustStanInputError(f"{argument}: missing values (NaN, None or NA) in column(s) {columns} at rows "
                                   f"{_row_list(rows)} (index labels); drop or impute them")


def _refuse_non_finite(values: np.ndarray, columns, rows: pd.Index, argument: str, what: str) -> None:
    if not np.issubdtype(values.dtype, np.number):
        return
    bad = ~np.isfinite(values.astype(float))
    if bad.any():
        names = [str(c) for c, b in zip(columns, bad.any(axis=0)) if b]
        raise RobustStanInputError(f"{argument}: the {what} column(s) {names} are not finite (NaN or inf) at rows "
                                   f"{_row_list(rows[bad.any(axis=1)])} (index labels); a transformation outside "
                                   "its domain, such as the log of 0, gives these")


def _model_matrix(formula: str, frame: pd.DataFrame, argument: str, spec=None):
    """formulaic's model matrices of ``formula`` on ``frame`` (or of its ``spec``, the encoding of
    another data set), missing values left in for the checks here; its errors become ours, and a
    category the encoding has not seen is refused rather than encoded as zeros."""
    import formulaic
    from formulaic.errors import DataMismatchWarning

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("error", DataMismatchWarning)
        try:
            if spec is None:
                return formulaic.model_matrix(formula, frame, na_action="ignore", output="pandas")
            return spec.get_model_matrix(frame)
        except DataMismatchWarning as err:
            raise RobustStanInputError(f"{argument}: {_unseen_categories(spec, frame) or err}; these rows cannot be "
                                       "encoded as the model was fitted") from None
        except RobustStanInputError:
            raise
        except Exception as err:  # formulaic's parse and evaluation errors, whose messages say what is wrong
            raise RobustStanInputError(f"formula: formulaic cannot build {formula!r} from {argument}: "
                                       f"{type(err).__name__}: {_plain(err)}") from None


def _plain(err: Exception) -> str:
    """formulaic's message without its terminal colours and the brackets it marks the place with."""
    return re.sub(r"\x1b\[[0-9;]*m|[\u29da\u29db]", "", str(err)).strip()


def _unseen_categories(spec, frame: pd.DataFrame) -> str:
    """Which rows of ``frame`` hold categories that ``spec`` (formulaic's encoding of another data
    set) has not seen, for the categorical factors that are a column or ``C(column, ...)``."""
    found = []
    for factor, (kind, state) in spec.encoder_state.items():
        if getattr(kind, "value", kind) != "categorical" or "categories" not in state:
            continue
        name = re.match(r"^C\(\s*([A-Za-z_.][A-Za-z0-9_.]*)\s*[,)]", factor)
        column = factor if factor in frame.columns else name.group(1) if name else None
        if column not in frame.columns:
            continue
        values = frame[column]
        unseen = ~values.isin(state["categories"]).to_numpy() & values.notna().to_numpy()
        if unseen.any():
            levels = sorted({str(v) for v in values[unseen]})
            found.append(f"{factor} has the level(s) {levels}, which the training data did not have, at rows "
                         f"{_row_list(frame.index[unseen])} (index labels)")
    return "; ".join(found)


# -- the arrays ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupTerm:
    """One group-level term's arrays on one data set.

    Parameters
    ----------
    name : str
        The grouping factor's columns joined by ``:``, e.g. ``"g"`` or ``"g1:g2"`` (without backticks).
    stan_name : str
        A Stan identifier for the term's parameters, unique in the formula (``"g1_g2"``).
    coefficients : tuple of str
        The varying coefficients' names, e.g. ``("Intercept", "x")``.
    Z : numpy.ndarray
        (N, K) float: row n's values of the K varying coefficients' columns.
    index : numpy.ndarray
        (N,) int: the level of row n, 0-based into ``levels``.
    levels : tuple of str
        The levels' names: the training data's levels in their order, then (on new data with
        ``new_levels="flag"``) the new ones in the order met.
    n_fitted_levels : int
        How many of ``levels`` the training data had (the model has effects for these).
    correlated : bool
        Whether one level's coefficients are correlated (``|``) or independent (``||``).
    """

    name: str
    stan_name: str
    coefficients: tuple[str, ...]
    Z: np.ndarray
    index: np.ndarray
    levels: tuple[str, ...]
    n_fitted_levels: int
    correlated: bool = True

    @property
    def new_rows(self) -> np.ndarray:
        """Rows whose level the training data did not have (bool, (N,))."""
        return self.index >= self.n_fitted_levels


@dataclass(frozen=True)
class Design:
    """A formula's arrays on one data set.

    Parameters
    ----------
    y : numpy.ndarray or None
        The outcome (N,), in the data's own dtype; None when it was not asked for.
    X : numpy.ndarray
        (N, P) float: the population-level design, without the intercept column.
    columns : tuple of str
        The names of X's columns, formulaic's (``"x1"``, ``"C(g)[T.b]"``, ``"x1:x2"``).
    intercept : bool
        Whether the formula has a population-level intercept.
    groups : tuple of GroupTerm
        The group-level terms.
    rows : pandas.Index
        The data's row labels.
    encoding : FormulaEncoding or None
        The training data's encoding, for designs of new data (None for a design of a plain ``X``).
    """

    y: np.ndarray | None
    X: np.ndarray
    columns: tuple[str, ...]
    intercept: bool
    groups: tuple[GroupTerm, ...]
    rows: pd.Index
    encoding: FormulaEncoding | None = field(repr=False)

    def take(self, rows: np.ndarray) -> Design:
        """The design of some of its rows (0-based positions), as a row-subset fit (a coreset) holds them.

        Parameters
        ----------
        rows : numpy.ndarray
            0-based positions of the rows kept, in the order kept.

        Returns
        -------
        Design
            The same columns, levels and encoding, on those rows.
        """
        groups = tuple(replace(term, Z=term.Z[rows], index=term.index[rows]) for term in self.groups)
        return replace(self, y=None if self.y is None else self.y[rows], X=self.X[rows], groups=groups,
                       rows=self.rows[rows])


def _stan_names(factors: list[str]) -> list[str]:
    """Stan identifiers for the grouping factors: letters, digits and underscores, unique."""
    names: list[str] = []
    for factor in factors:
        base = re.sub(r"[^A-Za-z0-9_]+", "_", factor.replace("`", "")).strip("_") or "group"  # Stan: ASCII
        base = base if base[0].isalpha() else "g_" + base
        name, k = base, 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names


def _level_name(value) -> str:
    return ":".join(str(v) for v in value) if isinstance(value, tuple) else str(value)


def _levels_of(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.Index:
    """The levels of a grouping factor in the training data: a categorical column's categories in
    their order (those present), otherwise sorted where the values sort, else in the order met."""
    if len(columns) == 1:
        values = frame[columns[0]]
        if isinstance(values.dtype, pd.CategoricalDtype):
            present = set(values.dropna().unique())
            return pd.Index([c for c in values.cat.categories if c in present], dtype=object, tupleize_cols=False)
        unique = pd.unique(values.to_numpy())
    else:
        unique = pd.unique(pd.Series(list(zip(*(frame[c].to_numpy() for c in columns))), dtype=object))
    try:
        unique = sorted(unique)
    except TypeError:
        unique = list(unique)
    return pd.Index(unique, dtype=object, tupleize_cols=False)


def _level_keys(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.Index:
    if len(columns) == 1:
        return pd.Index(frame[columns[0]].to_numpy(), dtype=object, tupleize_cols=False)
    return pd.Index(list(zip(*(frame[c].to_numpy() for c in columns))), dtype=object, tupleize_cols=False)


def _check_columns(frame: pd.DataFrame, formula: ParsedFormula, fixed_spec, groups: list, outcome: bool,
                   argument: str) -> None:
    """Every column the formula reads (its outcome with ``outcome``; ``groups`` holds each group-level
    term and formulaic's encoding of its coefficients) is in ``frame`` and has no missing value."""
    rhs = fixed_spec.rhs if formula.outcome is not None else fixed_spec
    needed = list(rhs.required_variables)
    _require_columns(frame, needed, argument, f"the formula {formula.text!r}")
    if outcome:
        _require_columns(frame, fixed_spec.lhs.required_variables, argument, "the formula's outcome")
        needed += list(fixed_spec.lhs.required_variables)
    for term, spec in groups:
        where = f"the group-level term {term.text!r}"
        _require_columns(frame, term.factor_columns, argument, where)
        _require_columns(frame, spec.required_variables, argument, where)
        needed += [*term.factor_columns, *spec.required_variables]
    if INTERCEPT in {str(name) for name in needed}:
        raise RobustStanInputError(f"{argument}: the formula reads a column named {INTERCEPT!r}, the name formulaic "
                                   "and brms give the intercept; rename the column")
    _refuse_missing(frame, needed, argument)


@dataclass(frozen=True)
class _GroupEncoding:
    term: GroupTermFormula
    stan_name: str
    spec: Any  # formulaic's ModelSpec of the varying coefficients
    levels: pd.Index


class FormulaEncoding:
    """A formula's encoding of its training data, which builds the same design for other data.

    It keeps formulaic's encodings (categories and contrasts, the state of stateful transforms such
    as ``center(x)``) and each grouping factor's levels, so new rows get the training columns in
    the training order and the training levels' indices. Build one with :func:`formula_design`.

    Parameters
    ----------
    formula : ParsedFormula
        The formula.
    fixed_spec : object
        formulaic's ``ModelSpecs`` of the formula's population-level part on the training data
        (outcome and predictors).
    groups : list
        Each group-level term's encoding, in the formula's order.
    """

    def __init__(self, formula: ParsedFormula, fixed_spec, groups: list[_GroupEncoding]):
        self.formula = formula
        self._fixed_spec = fixed_spec
        self._groups = list(groups)

    def __repr__(self) -> str:
        return f"<robust_stan FormulaEncoding {self.formula.text!r}>"

    @property
    def columns(self) -> tuple[str, ...]:
        """The names of the design matrix's columns, without the intercept (tuple of str)."""
        return tuple(name for name in self._rhs_spec.column_names if name != INTERCEPT)

    @property
    def intercept(self) -> bool:
        """Whether the formula has a population-level intercept (bool)."""
        return INTERCEPT in self._rhs_spec.column_names

    @property
    def _rhs_spec(self):
        return self._fixed_spec.rhs if self.formula.outcome is not None else self._fixed_spec

    @classmethod
    def from_data(cls, formula: str | ParsedFormula, data, argument: str = "data") -> FormulaEncoding:
        """Encode a formula on training data.

        Parameters
        ----------
        formula : str or ParsedFormula
            The formula.
        data : pandas.DataFrame or dict of array_like
            The training data, one column per variable.
        argument : str, default "data"
            The argument's name in error messages.

        Returns
        -------
        FormulaEncoding
            The encoding.

        Raises
        ------
        RobustStanInputError
            If the formula cannot be read or built from the data, or a column it reads is missing.
        """
        parsed = formula if isinstance(formula, ParsedFormula) else parse_formula(formula)
        frame = _as_frame(data, argument)
        fixed_text = parsed.fixed if parsed.outcome is None else f"{parsed.outcome} ~ {parsed.fixed}"
        fixed_spec = _model_matrix(fixed_text, frame, argument).model_spec
        specs = []
        for term in parsed.groups:
            _require_columns(frame, term.factor_columns, argument, f"the group-level term {term.text!r}")
            spec = _model_matrix(term.expression, frame, argument).model_spec
            if not spec.column_names:
                raise RobustStanInputError(f"formula: the group-level term {term.text!r} has no varying coefficient")
            specs.append(spec)
        _check_columns(frame, parsed, fixed_spec, list(zip(parsed.groups, specs)), parsed.outcome is not None, argument)
        return cls(parsed, fixed_spec, [_GroupEncoding(term, name, spec, _levels_of(frame, term.factor_columns))
                                        for term, name, spec in zip(parsed.groups, parsed.group_stan_names, specs)])

    def design(self, data, *, new_levels: str = "error", outcome: bool = False, argument: str = "data") -> Design:
        """The formula's arrays on ``data``, encoded as the training data were.

        Parameters
        ----------
        data : pandas.DataFrame or dict of array_like
            The rows, one column per variable the formula reads (the outcome only with ``outcome``).
        new_levels : {"error", "flag"}, default "error"
            A level of a grouping factor the training data did not have: refuse it, or give it an
            index from ``n_fitted_levels`` on (:attr:`GroupTerm.new_rows`; a model draws its
            effects from the group distribution).
        outcome : bool, default False
            Also evaluate the outcome (the left-hand side).
        argument : str, default "data"
            The argument's name in error messages.

        Returns
        -------
        Design
            The arrays.

        Raises
        ------
        RobustStanInputError
            If a column is missing, a value the formula reads is missing or not finite (naming the
            rows), a category or (with ``new_levels="error"``) a group level is new, or the outcome
            is asked of a one-sided formula or is not one numeric column.
        """
        if new_levels not in NEW_LEVELS:
            raise RobustStanInputError(f"new_levels: must be one of {list(NEW_LEVELS)}, got {new_levels!r}")
        frame = _as_frame(data, argument)
        if outcome and self.formula.outcome is None:
            raise RobustStanInputError(f"formula: {self.formula.text!r} has no outcome (nothing left of '~')")
        _check_columns(frame, self.formula, self._fixed_spec, [(g.term, g.spec) for g in self._groups], outcome,
                       argument)
        rhs = self._rhs_spec
        y = None
        matrix = _model_matrix(self.formula.text, frame, argument, rhs)
        X = matrix.drop(columns=[INTERCEPT], errors="ignore").to_numpy(dtype=float)
        columns = tuple(str(c) for c in matrix.columns if c != INTERCEPT)
        _refuse_non_finite(X, columns, frame.index, argument, "design matrix's")
        if outcome:
            outcome_matrix = _model_matrix(self.formula.text, frame, argument, self._fixed_spec.lhs)
            if outcome_matrix.shape[1] != 1:
                raise RobustStanInputError(
                    f"formula: the outcome {self.formula.outcome!r} must be one numeric column; formulaic makes "
                    f"{list(outcome_matrix.columns)} of it (give a categorical outcome as integer codes 1..K)")
            y = outcome_matrix.iloc[:, 0].to_numpy()
            _refuse_non_finite(y[:, None], [self.formula.outcome], frame.index, argument, "outcome")
        groups = tuple(self._group_design(group, frame, new_levels, argument) for group in self._groups)
        return Design(y, X, columns, self.intercept, groups, frame.index, self)

    def _group_design(self, group: _GroupEncoding, frame: pd.DataFrame, new_levels: str, argument: str) -> GroupTerm:
        term = group.term
        where = f"the group-level term {term.text!r}"
        Z = _model_matrix(term.expression, frame, argument, group.spec)
        _refuse_non_finite(Z.to_numpy(dtype=float), Z.columns, frame.index, argument, f"{where}'s")
        keys = _level_keys(frame, term.factor_columns)
        index = group.levels.get_indexer(keys)
        levels = [_level_name(level) for level in group.levels]
        unseen = index < 0
        if unseen.any():
            new = pd.Index(pd.unique(keys[unseen]), dtype=object, tupleize_cols=False)
            if new_levels == "error":
                raise RobustStanInputError(
                    f"{argument}: the grouping factor {term.factor!r} has the level(s) "
                    f"{[_level_name(v) for v in new[:_SHOWN_ROWS]]}, which the training data did not have, at rows "
                    f"{_row_list(frame.index[unseen])} (index labels); fit.predict(..., new_levels='sample') draws "
                    "their effects from the group distribution")
            index[unseen] = len(levels) + new.get_indexer(keys[unseen])
            levels += [_level_name(level) for level in new]
        twice = sorted({level for level in levels if levels.count(level) > 1})
        if twice:  # e.g. 1 and "1" in one column, or the pairs ("a:b", "c") and ("a", "b:c")
            raise RobustStanInputError(f"{argument}: distinct levels of the grouping factor {term.factor!r} have the "
                                       f"same name {twice}; recode them so that their names differ")
        return GroupTerm(":".join(term.factor_columns), group.stan_name, tuple(str(c) for c in Z.columns),
                         Z.to_numpy(dtype=float), index.astype(np.int64), tuple(levels), len(group.levels),
                         term.correlated)


def formula_design(formula: str, data, argument: str = "data") -> Design:
    """A formula's outcome, design matrix and group-level terms on its training data.

    Parameters
    ----------
    formula : str
        A Wilkinson formula with an outcome, e.g. ``"y ~ x1 + C(g) + (1 | school)"``.
    data : pandas.DataFrame or dict of array_like
        The training data, one column per variable.
    argument : str, default "data"
        The argument's name in error messages.

    Returns
    -------
    Design
        The arrays; ``design.encoding.design(new_data)`` builds the same columns for new rows.

    Raises
    ------
    RobustStanInputError
        If the formula has no outcome or cannot be read or built from the data, or a value it
        reads is missing (naming the rows) or not finite.
    """
    parsed = parse_formula(formula)
    if parsed.outcome is None:
        raise RobustStanInputError(f"formula: {formula!r} has no outcome; write it as 'y ~ ...'")
    return FormulaEncoding.from_data(parsed, data, argument).design(data, outcome=True, argument=argument)


# -- Stan data ---------------------------------------------------------------------------------

def group_data_names(term: GroupTerm | str) -> dict[str, str]:
    """The Stan data names of one group-level term: its level count ``G_<s>``, coefficient count
    ``K_<s>``, rows' levels ``J_<s>`` and varying coefficients' columns ``Z_<s>``, where ``<s>`` is
    the term's Stan name.

    Parameters
    ----------
    term : GroupTerm or str
        The term, or its Stan name.

    Returns
    -------
    dict of str
        ``{"G": "G_<s>", "K": "K_<s>", "J": "J_<s>", "Z": "Z_<s>"}``.
    """
    name = term if isinstance(term, str) else term.stan_name
    return {part: f"{part}_{name}" for part in ("G", "K", "J", "Z")}


def design_stan_data(design: Design) -> dict:
    """The Stan data of a training design: ``y`` (when evaluated), ``X`` and per group-level term
    ``G_<s>``, ``K_<s>``, ``J_<s>`` (1-based levels) and ``Z_<s>`` (:func:`group_data_names`).

    Parameters
    ----------
    design : Design
        A design whose group levels are all fitted ones (not new data with flagged levels).

    Returns
    -------
    dict
        Stan data by name; robust-stan's switches, ``N``, ``P`` and the prior scales are added when
        the data are prepared.

    Raises
    ------
    RobustStanInputError
        If a row has a group level the encoding did not fit (there is no effect to estimate for it
        in a design meant for fitting).
    """
    out: dict = {} if design.y is None else {"y": design.y}
    out["X"] = design.X
    for term in design.groups:
        if term.new_rows.any():
            raise RobustStanInputError(f"data: the grouping factor {term.name!r} has levels the model was not fitted "
                                       f"to, at rows {_row_list(design.rows[term.new_rows])} (index labels)")
        names = group_data_names(term)
        out[names["G"]] = term.n_fitted_levels
        out[names["K"]] = len(term.coefficients)
        out[names["J"]] = term.index + 1
        out[names["Z"]] = term.Z
    return out


def trials_column(formula: ParsedFormula, data, argument: str = "data") -> np.ndarray:
    """A binomial outcome's numbers of trials, the column named by ``y | trials(n) ~ ...``.

    Parameters
    ----------
    formula : ParsedFormula
        The formula, with :attr:`ParsedFormula.trials`.
    data : pandas.DataFrame or dict of array_like
        The rows.
    argument : str, default "data"
        The argument's name in error messages.

    Returns
    -------
    numpy.ndarray
        (N,) int64.

    Raises
    ------
    RobustStanInputError
        If the column is missing, has a missing value (naming the rows) or is not whole numbers.
    """
    frame = _as_frame(data, argument)
    name = formula.trials
    _require_columns(frame, [name], argument, "the formula's trials(...)")
    _refuse_missing(frame, [name], argument)
    values = frame[name].to_numpy()
    if not np.issubdtype(values.dtype, np.number) or not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
        raise RobustStanInputError(f"{argument}: the trials column {name!r} must hold whole numbers")
    return values.astype(np.int64)


def formula_data(formula: ParsedFormula, data, argument: str = "data") -> tuple[dict, Design]:
    """A formula model's data on its training data frame: :func:`design_stan_data` of the design and,
    for ``y | trials(n) ~ ...``, ``trials``.

    Parameters
    ----------
    formula : ParsedFormula
        The model's formula.
    data : pandas.DataFrame or dict of array_like
        The training data, one column per variable.
    argument : str, default "data"
        The argument's name in error messages.

    Returns
    -------
    data : dict
        The model's data by name (``y`` in its own units, ``X``, the group-level terms' data).
    design : Design
        The design, whose encoding builds the same columns for new rows.

    Raises
    ------
    RobustStanInputError
        As :func:`formula_design` and :func:`trials_column`.
    """
    if formula.outcome is None:
        raise RobustStanInputError(f"formula: {formula.text!r} has no outcome; write it as 'y ~ ...'")
    design = FormulaEncoding.from_data(formula, data, argument).design(data, outcome=True, argument=argument)
    out = design_stan_data(design)
    if formula.trials is not None:
        out["trials"] = trials_column(formula, data, argument)
    return out, design
