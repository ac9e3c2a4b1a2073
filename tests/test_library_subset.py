"""The library subset pasted into programs (robust_stan.building.library_subset).

Checked by stanc itself: every generated program, with only the functions it uses pasted in,
translates; nothing of the library is lost in the split; and a program keeps exactly the functions
it reaches (a hand-written call, the ``~`` form and the ``_lupdf`` form of a density).
"""

from pathlib import Path

import pytest

import robust_stan as rs
from robust_stan.building.codegen import INCLUDE_LINE, expand_includes
from robust_stan.building.library_subset import _split_top_level, library_subset
from robust_stan.common.resources import library_code
from robust_stan.engines.httpstan_build import translate

PROGRAMS = Path(__file__).parent / "stan_programs"


def _built_in_programs():
    yield "glm normal", rs.glm("normal").stan_code
    yield "glm bernoulli mislabel", rs.glm("bernoulli", mislabel=True).stan_code
    for family in ("student_t", "binomial", "poisson", "categorical", "exponential"):
        yield f"glm {family}", rs.glm(family).stan_code
    for family in ("normal", "multi_normal", "bernoulli", "poisson"):
        yield f"location {family}", rs.location(family).stan_code
    yield "robustified two_outcomes", rs.robustify(PROGRAMS / "two_outcomes.stan").stan_code
    yield "robustified multi_normal_location", rs.robustify(PROGRAMS / "multi_normal_location.stan").stan_code


def test_the_split_loses_nothing():
    library = library_code()
    header, functions = _split_top_level(library)
    assert header + "".join(f.text for f in functions) == library.rstrip()  # all but the final newline
    assert len({f.name for f in functions}) > 100


@pytest.mark.parametrize("name, code", list(_built_in_programs()), ids=lambda v: v if len(v) < 40 else "")
def test_every_program_translates_with_its_subset(name, code):
    expanded = expand_includes(code)
    assert len(expanded) < len(code) + len(library_code()) / 2, name  # most of the library is left out
    translate(expanded, "model_subset")   # raises with stanc's message when a needed function is missing


def test_a_program_keeps_the_functions_it_reaches():
    program = """functions {
#include robust_stan.stanfunctions
}
data { int N; vector[N] y; array[N] int k; }
parameters { real mu; real<lower=0> sigma; }
model {
  y ~ betad_normal(mu, sigma, 0.5);
  target += gammad_poisson_log_lupmf(k | mu, 0.3);
}
"""
    subset = library_subset(library_code(), program.replace(INCLUDE_LINE, ""))
    assert "real betad_normal_lpdf(" in subset and "real gammad_poisson_log_lpmf(" in subset
    assert "bernoulli" not in subset.split("(the functions this program uses)")[1]
    translate(expand_includes(program), "model_subset")
    nothing = library_subset(library_code(), "parameters { real x; }")
    assert "real " not in nothing.split("(the functions this program uses)")[1]
