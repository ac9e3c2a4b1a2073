"""Renders a :class:`~robust_stan.building.spec.ModelSpec` into a Stan program."""

from __future__ import annotations

import re
from dataclasses import dataclass

import jinja2

from .._version import __version__
from ..common.resources import LIBRARY_FILE, NATIVE_FILE, library_code, native_code, templates_path
from .library_subset import library_subset
from .spec import ModelSpec, split_statements

INCLUDE_LINE = f"#include {LIBRARY_FILE}"
NATIVE_INCLUDE_LINE = f"#include {NATIVE_FILE}"


@dataclass(frozen=True)
class RenderedArgument:
    """How one family argument appears in the generated program."""

    fill: list[str]          # statements building the vectorised value (generated quantities)
    call: str                # what the vectorised library call receives (generated quantities)
    model_fill: list[str]    # the same for the model block (mode 0)
    model_call: str
    per_observation: str     # what the one-row call of per-example mode receives
    indexed: str             # the value for observation n (posterior predictive draws)


def _render_argument(spec: ModelSpec, fam_arg) -> RenderedArgument:
    if fam_arg.data_only:
        return RenderedArgument([], fam_arg.name, [], fam_arg.name, f"{fam_arg.name}[n:n]", f"{fam_arg.name}[n]")
    arg = spec.args[fam_arg.name]
    local = f"arg_{fam_arg.name}"
    # In the model block an expression goes straight into the call: a local there would
    # be an autodiff copy (for a data D x D matrix, D^2 needless nodes per row of work).
    if arg.shared:
        fill = [f"{fam_arg.shared_declaration(local)} = {arg.per_observation};"]
        return RenderedArgument(fill, local, [], arg.per_observation, arg.per_observation, local)
    declaration = fam_arg.local_decl.format(name=local)
    if arg.vectorised:
        fill = [f"{declaration} = {arg.vectorised};"]
        return RenderedArgument(fill, local, [], arg.vectorised, arg.per_observation, f"{local}[n]")
    fill = [f"{declaration};", f"for (n in 1:N) {local}[n] = {arg.per_observation};"]
    return RenderedArgument(fill, local, fill, local, arg.per_observation, f"{local}[n]")


def _linear_predictor_call(spec: ModelSpec) -> list[str]:
    """The family arguments of mode 3's one vectorised call over the batch rows."""
    lp = spec.linear_predictor
    assert lp is not None, "mode 3 is generated for linear-predictor models only"
    # of_eta names eta and any other parameter in braces; each becomes its per-row copies
    copies = {p.name: f"to_vector({p.name}_copies)" for p in spec.parameters if p.name != lp.coefficients}
    copies["eta"] = copies.pop(lp.intercept)
    call = []
    for fam_arg in spec.family.args:
        if fam_arg.data_only:
            call.append(f"{fam_arg.name}[batch]")
        elif fam_arg.name == lp.argument:
            call.append(lp.of_eta.format(**copies))
        else:  # a real parameter (checked by the spec), one copy per row
            call.append(f"to_vector({spec.args[fam_arg.name].per_observation.strip()}_copies)")
    return call


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_path())),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
    )


def render_program(spec: ModelSpec) -> str:
    """The readable Stan program of a specification (with the library `#include`d)."""
    spec.check()
    args = [_render_argument(spec, a) for a in spec.family.args]
    rng_values = {a.name: r.indexed for a, r in zip(spec.family.args, args)}
    template = _environment().get_template("program.stan.j2")
    return template.render(
        title=spec.title,
        version=__version__,
        family=spec.family,
        user_data=[s + ";" for s in split_statements(spec.data)],
        transformed_data=[line.strip() for line in spec.transformed_data.strip().splitlines() if line.strip()],
        parameters=spec.parameters,
        priors=[line.strip() for line in spec.priors.strip().splitlines() if line.strip()],
        args=args,
        rng=spec.family.rng.format(**rng_values),
        lp=spec.linear_predictor,
        lp_call=_linear_predictor_call(spec) if spec.linear_predictor else [],
    )


def expand_includes(program: str) -> str:
    """The program with the robust-stan library (and the native losses' declarations) pasted in
    place of their `#include` lines: of the library, only the functions the program uses
    (:func:`~robust_stan.building.library_subset.library_subset`), which shortens the C++ compile.

    Engines whose stanc is not given include paths (httpstan, BridgeStan) compile this.

    Parameters
    ----------
    program : str
        A Stan program that may include ``robust_stan.stanfunctions`` and
        ``robust_stan_native.stanfunctions``.

    Returns
    -------
    str
        The program with those includes pasted in.
    """
    include = re.compile(rf"^\s*{re.escape(INCLUDE_LINE)}\s*$", flags=re.MULTILINE)
    if include.search(program):
        subset = library_subset(library_code(), include.sub("", program))
        program = include.sub(lambda _: subset, program)
    native = re.compile(rf"^\s*{re.escape(NATIVE_INCLUDE_LINE)}\s*$", flags=re.MULTILINE)
    return native.sub(lambda _: native_code(), program)

