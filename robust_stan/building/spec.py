"""Model specifications: what a generated Stan program is made of.

A :class:`ModelSpec` holds the family, the user's data and parameter
declarations, the prior statements and, for each family argument, a Stan
expression for observation ``n``. The built-in models (:mod:`robust_stan.api.builtin`)
are specifications too, so every program comes from one template.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..common.errors import RobustStanInputError
from .families import Family
from .formulas import ParsedFormula

# Unconstrained local type of each Stan parameter base type; "{dims}" is the
# declared size, "{square}" a square matrix of the declared size.
_LOCAL_BASE_TYPES = {
    "real": "real",
    "vector": "vector[{dims}]",
    "simplex": "vector[{dims}]",
    "unit_vector": "vector[{dims}]",
    "sum_to_zero_vector": "vector[{dims}]",
    "ordered": "vector[{dims}]",
    "positive_ordered": "vector[{dims}]",
    "row_vector": "row_vector[{dims}]",
    "matrix": "matrix[{dims}]",
    "column_stochastic_matrix": "matrix[{dims}]",
    "row_stochastic_matrix": "matrix[{dims}]",
    "cholesky_factor_corr": "matrix[{square}]",
    "corr_matrix": "matrix[{square}]",
    "cov_matrix": "matrix[{square}]",
    "cholesky_factor_cov": "matrix[{cholesky_cov}]",
}

_DECLARATION = re.compile(
    r"""^\s*
    (?:array\s*\[(?P<array_dims>[^\[\]]+)\]\s*)?
    (?P<base>[a-z_]+)\s*
    (?P<constraint><[^<>]*>)?\s*
    (?:\[(?P<dims>[^\[\]]+)\])?\s*
    (?P<name>[A-Za-z][A-Za-z0-9_]*)\s*$""",
    re.VERBOSE,
)

#: The mislabelling likelihood's parameter (``rs.glm(..., mislabel=True)``).
FLIP_RATE = "flip_rate"

_IDENTIFIER = re.compile(r"\b[A-Za-z][A-Za-z0-9_]*\b")


@dataclass(frozen=True)
class ParameterDeclaration:
    """One parameter as the user declared it, e.g. ``vector<lower=0>[P] b``.

    Parameters
    ----------
    text : str
        The declaration as written.
    name : str
        The parameter's name.
    base : str
        Its base type (``real``, ``vector``, ...).
    constraint : str
        Its constraint, e.g. ``<lower=0>`` (empty when none).
    dims : str
        The base type's sizes, e.g. ``[P]``.
    array_dims : str
        The array sizes, e.g. ``[G]`` (empty when not an array).
    """

    text: str
    name: str
    base: str
    constraint: str
    dims: str
    array_dims: str

    @classmethod
    def parse(cls, text: str) -> ParameterDeclaration:
        """Read one Stan declaration.

        Parameters
        ----------
        text : str
            One declaration, e.g. ``"array[G] real<lower=0> tau;"``.

        Returns
        -------
        ParameterDeclaration
            Its parts.

        Raises
        ------
        RobustStanInputError
            If the text is not one declaration of a type robust-stan can copy per example.
        """
        match = _DECLARATION.match(text)
        if not match:
            raise RobustStanInputError(
                f"parameters: cannot read the declaration {text.strip()!r}; write one Stan declaration per "
                "statement, e.g. 'vector[P] b;' or 'array[G] real<lower=0> tau;'"
            )
        base = match["base"]
        if base not in _LOCAL_BASE_TYPES:
            raise RobustStanInputError(
                f"parameters: unsupported parameter type {base!r} in {text.strip()!r}; "
                f"supported: {', '.join(sorted(_LOCAL_BASE_TYPES))}"
            )
        constraint = match["constraint"] or ""
        if "offset" in constraint or "multiplier" in constraint:
            raise RobustStanInputError(
                f"parameters: offset/multiplier in {text.strip()!r} is not supported; "
                "use a non-centred parameterisation written out in the argument expressions"
            )
        return cls(
            text=text.strip(),
            name=match["name"],
            base=base,
            constraint=constraint,
            dims=(match["dims"] or "").strip(),
            array_dims=(match["array_dims"] or "").strip(),
        )

    def _element_type(self, with_constraint: bool) -> str:
        constraint = self.constraint if with_constraint else ""
        dims = f"[{self.dims}]" if self.dims else ""
        return f"{self.base}{constraint}{dims}"

    def copies_declaration(self, count: str = "n_copies") -> str:
        """Declaration of the replicated parameter (one copy per batch row in per-example mode).

        Parameters
        ----------
        count : str, default "n_copies"
            Stan expression of the number of copies.

        Returns
        -------
        str
            The Stan declaration.
        """
        dims = f"{count}, {self.array_dims}" if self.array_dims else count
        return f"array[{dims}] {self._element_type(True)} {self.name}_copies;"

    def local_type(self) -> str:
        """Unconstrained Stan type of one copy, for a local variable.

        Returns
        -------
        str
            The Stan type.
        """
        dims = self.dims
        parts = [p.strip() for p in dims.split(",")] if dims else []
        square = f"{parts[0]}, {parts[0]}" if parts else ""
        cholesky_cov = f"{parts[0]}, {parts[1]}" if len(parts) == 2 else square
        element = _LOCAL_BASE_TYPES[self.base].format(dims=dims, square=square, cholesky_cov=cholesky_cov)
        return f"array[{self.array_dims}] {element}" if self.array_dims else element

    def declaration(self) -> str:
        """The user's own declaration (with constraints), for generated quantities.

        Returns
        -------
        str
            The Stan declaration.
        """
        element = self._element_type(True)
        return f"array[{self.array_dims}] {element} {self.name}" if self.array_dims else f"{element} {self.name}"


def split_statements(text: str) -> list[str]:
    """Split Stan declarations on ';', dropping comments and empty pieces."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    return [piece.strip() for piece in text.split(";") if piece.strip()]


def mentions_observation_index(expression: str) -> bool:
    """True when a Stan expression uses the observation index ``n``."""
    return "n" in _IDENTIFIER.findall(expression)


@dataclass(frozen=True)
class Argument:
    """A family argument: per-observation expression and optional vectorised form."""

    name: str
    per_observation: str
    vectorised: str | None = None

    @property
    def shared(self) -> bool:
        return not mentions_observation_index(self.per_observation)


# The models robust_stan.api.builtin.glm gives a LinearPredictor (for error messages)
LINEAR_PREDICTOR_MODELS = ("a built-in glm whose family arguments can vary by row "
                           "(normal, bernoulli, binomial, poisson, exponential)")


@dataclass(frozen=True)
class LinearPredictor:
    """How a glm's family argument depends on its linear predictor eta = intercept + design * coefficients.

    It enables the linear-predictor per-example mode (mode 3): one copy per batch row of
    the intercept, holding that row's whole eta, and of every other parameter, and no
    copy of the coefficients. The coefficients' per-example gradients follow by the chain
    rule, dl_i/deta_i * x_i (:mod:`robust_stan.gradients.per_example`). ``of_eta`` writes the
    family argument in terms of ``{eta}``, e.g. ``"exp(-({eta}))"`` for a rate, and of any other
    real parameter by its name in braces (filled with that parameter's per-row copies), e.g.
    ``"rs_bernoulli_logit_mislabel({eta}, {flip_rate})"``.
    """

    argument: str
    of_eta: str = "{eta}"
    intercept: str = "alpha"
    coefficients: str = "b"
    design: str = "X"


@dataclass
class ModelSpec:
    """Everything one generated program is made of.

    ``data`` and ``parameters`` hold Stan declarations; ``priors`` Stan
    statements over the parameters; ``args`` a Stan expression per family
    argument, written for observation ``n`` (e.g. ``"alpha + X[n] * b"``).
    ``standardize`` names how the outcome is rescaled before fitting
    (``"affine"``, ``"scale"``, ``"spread"`` (divided by 1.4826 x MAD, not centred: a model
    without an intercept) or ``None``) and ``rescale`` maps parameter names
    to how their draws return to the original scale.
    """

    family: Family
    data: str
    parameters: list[ParameterDeclaration]
    priors: str
    args: dict[str, Argument]
    title: str
    standardize: str | None = None
    rescale: dict[str, str] = field(default_factory=dict)
    #: the parameter declarations as the user wrote them (for error messages)
    parameters_text: str = ""
    #: Stan statements computed once from the data (e.g. a Cholesky factor)
    transformed_data: str = ""
    #: set by the built-in glms whose other arguments can vary by row: enables mode 3
    linear_predictor: LinearPredictor | None = None
    #: values the user fixed (``known=``), on the outcome's original scale, by data name
    known: dict[str, float] = field(default_factory=dict)
    #: how each known value moves with the outcome's standardisation (as ``rescale``)
    known_rescale: dict[str, str] = field(default_factory=dict)
    #: a glm built from a formula (``rs.glm(family, formula=...)``): its data come from a data frame
    formula: ParsedFormula | None = None

    @property
    def parameter_names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def data_names(self) -> list[str]:
        """Names of the user data the program declares (besides N, y and the switches)."""
        names = list(self.family.extra_data)
        for statement in split_statements(self.data):
            found = _IDENTIFIER.findall(statement.split("]")[-1] if "]" in statement else statement)
            if found:
                names.append(found[-1])
        return names

    def row_data_names(self) -> list[str]:
        """Data with one entry per observation: y, the weights, the family's per-row data
        (binomial trials) and user data whose declaration's first size is N
        (``vector[N] x``, ``matrix[N, P] X``, ``array[N] int g``, ...)."""
        names = ["y", "weights"] + [name for name in self.family.extra_data if name == "trials"]
        for statement in split_statements(self.data):
            without_bounds = re.sub(r"<[^<>]*>", "", statement)
            first_size = re.match(r"^\s*\w+\s*\[\s*([^,\]]+)", without_bounds)
            found = _IDENTIFIER.findall(statement.split("]")[-1] if "]" in statement else statement)
            if first_size and first_size.group(1).strip() == "N" and found:
                names.append(found[-1])
        return names

    def check(self) -> None:
        """Check the specification's own consistency (before any compile)."""
        expected = {a.name for a in self.family.args if not a.data_only}
        given = set(self.args)
        if given != expected:
            missing = sorted(expected - given)
            extra = sorted(given - expected)
            raise RobustStanInputError(
                f"args: the {self.family.name} family takes arguments {sorted(expected)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else "")
            )
        for fam_arg in self.family.args:
            if fam_arg.data_only:
                continue
            arg = self.args[fam_arg.name]
            if not isinstance(arg.per_observation, str) or not arg.per_observation.strip():
                raise RobustStanInputError(f"args: the expression for {fam_arg.name!r} must be a non-empty string")
            if fam_arg.varying_type is None and not arg.shared:
                raise RobustStanInputError(
                    f"args: {fam_arg.name!r} of the {self.family.name} family must be shared by all observations; "
                    f"its expression {arg.per_observation!r} uses n"
                )
        seen = set()
        for p in self.parameters:
            if p.name in seen:
                raise RobustStanInputError(f"parameters: {p.name!r} is declared twice")
            seen.add(p.name)
        if self.linear_predictor is not None:
            self._check_linear_predictor(self.linear_predictor)

    def _check_linear_predictor(self, lp: LinearPredictor) -> None:
        """Mode 3 copies every parameter but the coefficients once per row: the intercept must be
        a real, and every other family argument a real parameter that the library lets vary by row."""
        types = {p.name: p.base for p in self.parameters if not p.array_dims}
        problems = [] if lp.argument in self.args else [f"no family argument {lp.argument!r}"]
        if types.get(lp.intercept) != "real" or types.get(lp.coefficients) != "vector":
            problems.append(f"needs a real {lp.intercept!r} and a vector {lp.coefficients!r}")
        if lp.design not in self.data_names():
            problems.append(f"needs the data {lp.design!r}")
        for fam_arg in self.family.args:
            if fam_arg.data_only or fam_arg.name == lp.argument:
                continue
            name = self.args[fam_arg.name].per_observation.strip()
            if fam_arg.varying_type is None or types.get(name) != "real":
                problems.append(f"argument {fam_arg.name!r} must be a real parameter that can vary by row")
        if problems:
            raise RobustStanInputError(f"linear_predictor: {'; '.join(problems)}")
