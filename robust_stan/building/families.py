"""Likelihood families: their Stan names, arguments, data and support checks.

One :class:`Family` per supported likelihood. The Stan function library
(`stan/robust_stan.stanfunctions`) and the program template are both rendered
from these records, so a family is described in exactly one place.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..common.errors import RobustStanInputError


@dataclass(frozen=True)
class FamilyArg:
    """One argument of a family's density (after the outcome).

    ``shared_type`` is the Stan type when one value serves every observation,
    ``varying_type`` the library's container when each observation has its own
    (``None`` for arguments that must be shared, such as student_t's ``nu``),
    ``broadcast`` turns the shared value into that container, ``local_decl``
    declares the container in a generated program (``{name}`` is filled in).
    """

    name: str
    shared_type: str
    varying_type: str | None = None
    broadcast: str = ""
    local_decl: str = ""
    data_only: bool = False
    shared_decl: str = ""  # declaration of a shared value in a program; default "{shared_type} {name}"

    def shared_declaration(self, name: str) -> str:
        return (self.shared_decl or f"{self.shared_type} {{name}}").format(name=name)


@dataclass(frozen=True)
class Family:
    """A likelihood family with the facts the code generator and checks need.

    The field comments in the source say what each fact is for.

    Parameters
    ----------
    name : str
        The family's name in robust-stan (a key of :data:`robust_stan.FAMILIES`).
    stan_name : str
        Stan's name of the density.
    suffix : {"lpdf", "lpmf"}
        Continuous or discrete density.
    y_library_type : str
        Stan type of the outcome in the library's functions.
    args : tuple of FamilyArg
        The density's arguments after the outcome.
    y_data_decl : str
        Declaration(s) of the outcome in a program's data block.
    y_rep_decl : str
        Declaration of the replicated outcome.
    rng : str
        Stan expression of one replicate, arguments filled in by name.
    default_link : str
        The link :func:`robust_stan.glm` uses unless told otherwise.
    links : tuple of str
        The links offered.
    continuous : bool
        Whether the outcome is continuous.
    extra_data : tuple of str, default ()
        The family's own program data (binomial's trials, categorical's K, multi_normal's D).
    integral_table : bool, default False
        The library has a fast path with a table of the beta integral.
    native : bool, default False
        The C++ header has this family's beta and gamma total loss with a closed-form gradient.
    y_score : bool, default False
        The library has d/dy and d^2/dy^2 of log p (for the H-score).
    mislabel_bound : str, default ""
        Stan expression of the flip rate's identification bound; empty: no mislabelling
        likelihood.
    standardize : {"affine", "scale"} or None, default None
        How the built-in models standardise the outcome.
    class_labels : bool, default False
        The outcome is a class label 1..K.
    location_scale : bool, default False
        The built-in models' parameters are a location mu and a scale sigma.
    shape_parameters : tuple of tuple of str, default ()
        (name, declaration, default prior) of further shared parameters.
    intercept_prior : str, default "normal(0, 2.5)"
        :func:`robust_stan.location`'s default prior of the intercept.
    positive_rate : bool, default False
        The built-in models' parameter is a positive rate (exponential): :func:`robust_stan.location`
        declares ``real<lower=0> rate``, :func:`robust_stan.glm` models the mean exp(eta), so the
        rate exp(-eta).
    built_in : bool, default True
        The built-in models (:func:`robust_stan.glm`, :func:`robust_stan.location`,
        :func:`robust_stan.custom`) offer the family; False: only :func:`robust_stan.robustify` and
        the Stan function library do.
    glm_mean : callable or None, default None
        ``glm_mean(eta, data)``: the mean of y under :func:`robust_stan.glm`'s link at the linear
        predictor ``eta`` (``data`` holds binomial's ``trials``; categorical's eta and mean have a
        last axis of K classes, multi_normal's of D dimensions); None: the family has no predictions.
    glm_draw : callable or None, default None
        ``glm_draw(mean, values, rng)``: one draw of y per row of ``mean``, ``values`` holding
        the family's other parameters (``sigma``, ``nu``, multi_normal's Cholesky factor ``L``) and
        the rows' data (``trials``).
    """

    name: str
    stan_name: str
    suffix: str  # "lpdf" or "lpmf"
    y_library_type: str
    args: tuple[FamilyArg, ...]
    y_data_decl: str  # declaration(s) of the outcome in a program's data block
    y_rep_decl: str
    rng: str  # y_rep[n] = ...; per-observation arguments filled in by name
    default_link: str
    links: tuple[str, ...]
    continuous: bool
    extra_data: tuple[str, ...] = field(default_factory=tuple)
    # the library has robust_<stan_name>_integral_table(a) and overloads taking it (a fast path)
    integral_table: bool = False
    # robust_stan_native.hpp has rs_native_<stan_name>_total_loss: the beta and gamma total loss with a
    # closed-form gradient, which the built-in programs call for those divergences (a fast path)
    native: bool = False
    # the library has robust_<stan_name>_pointwise_y_score (d/dy and d^2/dy^2 of log p, for the
    # H-score): a univariate density on the whole real line
    y_score: bool = False
    # the mislabelling likelihood (rs.glm(..., mislabel=True)): the library has
    # rs_<stan_name>_mislabel(eta, e), the logits of the observed label's probabilities when each label
    # is replaced by one of the other classes with probability e; this is the Stan expression of
    # e's identification bound (empty: the family has no such likelihood)
    mislabel_bound: str = ""
    # how the built-in models standardise the outcome (rs.glm/rs.location with standardize=True):
    # "affine" (minus the median, over 1.4826 x MAD), "scale" (over the median) or None (as given);
    # the beta loss's "data barely count" pilot fits the matching density (normal, exponential)
    standardize: str | None = None
    # the outcome is a class label 1..K, with K given as data or read from y as max(y)
    class_labels: bool = False
    # the built-in models' parameters (rs.glm, rs.location): a location mu and a scale sigma (with the
    # prior SCALE_PRIOR), plus these shape parameters (name, declaration, default prior), shared by all rows
    location_scale: bool = False
    shape_parameters: tuple[tuple[str, str, str], ...] = ()
    # the default prior of rs.location's intercept alpha on the family's linear-predictor scale
    intercept_prior: str = "normal(0, 2.5)"
    positive_rate: bool = False
    # False: the library and rs.robustify have the family, rs.glm / rs.location / rs.custom refuse it
    # (they would need its links, priors, standardisation and replicates, which it does not define)
    built_in: bool = True
    # rs.glm's predictions (fit.predict): the mean of y from the linear predictor eta and the rows'
    # data (binomial's trials), and one draw of y from that mean, the family's other parameters
    # (sigma, nu; arrays that broadcast against it) and the rows' data; None: no predictions
    glm_mean: Callable[[np.ndarray, Mapping[str, np.ndarray]], np.ndarray] | None = field(default=None, repr=False)
    glm_draw: Callable[[np.ndarray, Mapping[str, np.ndarray], np.random.Generator], np.ndarray] | None = field(
        default=None, repr=False)

    @property
    def multivariate(self) -> bool:
        """True when each observation is a vector (multi_normal)."""
        return self.y_library_type == "array[] vector"

    def extra_stan_data(self, y: np.ndarray, data: dict) -> dict:
        """The family's own program data from the checked outcome and the user's data.

        Parameters
        ----------
        y : numpy.ndarray
            The checked outcome.
        data : dict
            The user's data.

        Returns
        -------
        dict
            ``extra_data`` by name: binomial's trials, categorical's K, multi_normal's D.
        """
        values = {"D": lambda: y.shape[1], "K": lambda: int(data["K"]),
                  "trials": lambda: data["trials"].astype(np.int64)}
        return {name: values[name]() for name in self.extra_data}

    # --- facts used by the library template -------------------------------
    @property
    def y_type(self) -> str:
        """The outcome's Stan type in the library's functions (str)."""
        return self.y_library_type

    @property
    def y_decl(self) -> str:
        """The outcome's declaration in the library's functions (str)."""
        return self.y_library_type

    @property
    def n_expr(self) -> str:
        """The Stan expression of the number of observations (str)."""
        return "size(y)"

    @property
    def arg_summary(self) -> str:
        """The argument names, ``*`` marking those that may vary by observation (str)."""
        parts = []
        for arg in self.args:
            star = "*" if arg.varying_type and not arg.data_only else ""
            parts.append(f"{arg.name}{star}")
        return ", ".join(parts)

    @property
    def signatures(self) -> list[dict[str, str]]:
        """Every overload: each argument either shared or per observation."""
        choices = []
        for arg in self.args:
            if arg.data_only:
                choices.append([("varying", arg)])
            elif arg.varying_type is None:
                choices.append([("shared", arg)])
            else:
                choices.append([("shared", arg), ("varying", arg)])
        out = []
        for combo in itertools.product(*choices):
            decls, core = [], []
            for how, arg in combo:
                if how == "shared":
                    decls.append(f"{arg.shared_type} {arg.name}")
                    core.append(arg.broadcast.format(name=arg.name) if arg.varying_type else arg.name)
                else:
                    decls.append(f"{arg.varying_type} {arg.name}")
                    core.append(arg.name)
            out.append(
                {
                    "args_decl": ", ".join(decls),
                    "core_args": ", ".join(core),
                    "arg_names": ", ".join(a.name for _, a in combo),
                }
            )
        return out

    def mislabelled(self, argument: str, rate: str) -> str:
        """The family argument of the mislabelling likelihood.

        Parameters
        ----------
        argument : str
            Stan expression of the clean labels' logits.
        rate : str
            Stan expression of the flip rate.

        Returns
        -------
        str
            Stan expression of the observed labels' logits.
        """
        return f"rs_{self.stan_name}_mislabel({argument}, {rate})"

    def check_outcome(self, y: np.ndarray, data: dict) -> np.ndarray:
        """Validate the outcome against the family's support.

        Parameters
        ----------
        y : numpy.ndarray
            The outcome.
        data : dict
            The user's data (binomial's trials, categorical's K).

        Returns
        -------
        numpy.ndarray
            The outcome, typed.

        Raises
        ------
        RobustStanInputError
            If a value lies outside the support.
        """
        return _OUTCOME_CHECKS[self.name](y, data)


#: The built-in models' default prior of a scale (sigma, tau), on the fitted scale.
SCALE_PRIOR = "exponential(1)"
#: student_t's degrees of freedom: declaration and default prior (Juarez and Steel 2010).
NU_PARAMETER = ("nu", "real<lower=1> nu", "gamma(2, 0.1)")


def _real_vector(name: str, broadcast: str = "rep_vector({name}, size(y))") -> FamilyArg:
    return FamilyArg(name, "real", "vector", broadcast, "vector[N] {name}")


#: The number of trials of each row (binomial, beta_binomial): data, one per observation.
_TRIALS = FamilyArg("trials", "int", "array[] int", "", "", data_only=True)
_COUNTS_OF_TRIALS = "array[N] int<lower=0> trials;\n  array[N] int<lower=0> y;"

def _inverse_logit(eta: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(eta)


def _identity_mean(eta, data):
    return np.asarray(eta, dtype=float)


def _logit_mean(eta, data):
    return _inverse_logit(eta)


def _logit_trials_mean(eta, data):
    return np.asarray(data["trials"]) * _inverse_logit(eta)


def _log_mean(eta, data):
    return np.exp(eta)


def _softmax_mean(eta, data):
    from scipy.special import softmax

    return softmax(eta, axis=-1)


def _categorical_draw(mean, values, rng):
    """A class 1..K per row from its probabilities (the last axis of ``mean``)."""
    cumulative = np.cumsum(mean, axis=-1)
    u = rng.random(np.shape(mean)[:-1] + (1,)) * cumulative[..., -1:]
    return 1 + np.minimum(np.sum(cumulative < u, axis=-1), np.shape(mean)[-1] - 1)


def _multi_normal_draw(mean, values, rng):
    """mean + L z per row, L the Cholesky factor of the covariance (..., D, D), z standard normal."""
    z = rng.standard_normal(np.shape(mean))
    return mean + np.einsum("...ij,...nj->...ni", values["L"], z)


def _normal_draw(mean, values, rng):
    return rng.normal(mean, values["sigma"])


def _student_t_draw(mean, values, rng):
    nu = np.broadcast_to(values["nu"], np.shape(mean))
    return mean + values["sigma"] * rng.standard_t(nu)


def _bernoulli_draw(mean, values, rng):
    return (rng.random(np.shape(mean)) < mean).astype(np.int64)


def _binomial_draw(mean, values, rng):
    trials = np.broadcast_to(values["trials"], np.shape(mean))
    probability = np.divide(mean, trials, out=np.zeros(np.shape(mean)), where=trials > 0)
    return rng.binomial(trials, np.clip(probability, 0.0, 1.0))


def _poisson_draw(mean, values, rng):
    return rng.poisson(mean)


def _exponential_draw(mean, values, rng):
    return rng.exponential(mean)


FAMILIES: dict[str, Family] = {}


def _register(family: Family) -> None:
    FAMILIES[family.name] = family


_register(
    Family(
        name="normal",
        stan_name="normal",
        suffix="lpdf",
        y_library_type="vector",
        args=(_real_vector("mu"), _real_vector("sigma")),
        y_data_decl="vector[N] y;",
        y_rep_decl="array[N] real y_rep;",
        rng="normal_rng({mu}, {sigma})",
        default_link="identity",
        links=("identity",),
        continuous=True,
        y_score=True,
        native=True,
        standardize="affine",
        location_scale=True,
        glm_mean=_identity_mean,
        glm_draw=_normal_draw,
    )
)
_register(
    Family(
        name="student_t",
        stan_name="student_t",
        suffix="lpdf",
        y_library_type="vector",
        args=(FamilyArg("nu", "real"), _real_vector("mu"), _real_vector("sigma")),
        y_data_decl="vector[N] y;",
        y_rep_decl="array[N] real y_rep;",
        rng="student_t_rng({nu}, {mu}, {sigma})",
        default_link="identity",
        links=("identity",),
        continuous=True,
        y_score=True,
        standardize="affine",
        location_scale=True,
        shape_parameters=(NU_PARAMETER,),
        glm_mean=_identity_mean,
        glm_draw=_student_t_draw,
    )
)
_register(
    Family(
        name="bernoulli",
        stan_name="bernoulli_logit",
        suffix="lpmf",
        y_library_type="array[] int",
        args=(_real_vector("eta"),),
        y_data_decl="array[N] int<lower=0, upper=1> y;",
        y_rep_decl="array[N] int y_rep;",
        rng="bernoulli_logit_rng({eta})",
        default_link="logit",
        links=("logit",),
        continuous=False,
        native=True,
        mislabel_bound="0.5",
        glm_mean=_logit_mean,
        glm_draw=_bernoulli_draw,
    )
)
_register(
    Family(
        name="binomial",
        stan_name="binomial_logit",
        suffix="lpmf",
        y_library_type="array[] int",
        args=(
            _TRIALS,
            _real_vector("eta"),
        ),
        y_data_decl=_COUNTS_OF_TRIALS,
        y_rep_decl="array[N] int y_rep;",
        rng="binomial_rng({trials}, inv_logit({eta}))",
        default_link="logit",
        links=("logit",),
        continuous=False,
        extra_data=("trials",),
        glm_mean=_logit_trials_mean,
        glm_draw=_binomial_draw,
    )
)
_register(
    Family(
        name="poisson",
        stan_name="poisson_log",
        suffix="lpmf",
        y_library_type="array[] int",
        args=(_real_vector("eta"),),
        y_data_decl="array[N] int<lower=0> y;",
        y_rep_decl="array[N] int y_rep;",
        rng="poisson_log_rng({eta})",
        default_link="log",
        links=("log",),
        continuous=False,
        integral_table=True,
        native=True,
        intercept_prior="normal(0, 5)",
        glm_mean=_log_mean,
        glm_draw=_poisson_draw,
    )
)
_register(
    Family(
        name="categorical",
        stan_name="categorical_logit",
        suffix="lpmf",
        y_library_type="array[] int",
        args=(FamilyArg("eta", "row_vector", "matrix", "rep_matrix({name}, size(y))", "matrix[N, K] {name}",
                        shared_decl="row_vector[K] {name}"),),
        y_data_decl="int<lower=2> K;\n  array[N] int<lower=1, upper=K> y;",
        y_rep_decl="array[N] int y_rep;",
        rng="categorical_logit_rng(({eta})')",
        default_link="softmax",
        links=("softmax", "logit"),
        continuous=False,
        extra_data=("K",),
        mislabel_bound="(K - 1.0) / K",
        class_labels=True,
        glm_mean=_softmax_mean,
        glm_draw=_categorical_draw,
    )
)
_register(
    Family(
        name="multi_normal",
        stan_name="multi_normal_cholesky",
        suffix="lpdf",
        y_library_type="array[] vector",
        args=(
            FamilyArg("mu", "vector", "array[] vector", "rep_array({name}, size(y))", "array[N] vector[D] {name}",
                      shared_decl="vector[D] {name}"),
            FamilyArg("L", "matrix", shared_decl="matrix[D, D] {name}"),
        ),
        y_data_decl="int<lower=1> D;\n  array[N] vector[D] y;",
        y_rep_decl="array[N] vector[D] y_rep;",
        rng="multi_normal_cholesky_rng({mu}, {L})",
        default_link="identity",
        links=("identity",),
        continuous=True,
        extra_data=("D",),
        glm_mean=_identity_mean,
        glm_draw=_multi_normal_draw,
    )
)
_register(
    Family(
        name="exponential",
        stan_name="exponential",
        suffix="lpdf",
        y_library_type="vector",
        args=(_real_vector("rate"),),
        y_data_decl="vector<lower=0>[N] y;",
        y_rep_decl="array[N] real y_rep;",
        rng="exponential_rng({rate})",
        default_link="log",
        links=("log",),
        continuous=True,
        standardize="scale",
        positive_rate=True,
        glm_mean=_log_mean,
        glm_draw=_exponential_draw,
    )
)


# Families for rs.robustify and the Stan function library only (built_in=False).
_register(
    Family(
        name="lognormal",
        stan_name="lognormal",
        suffix="lpdf",
        y_library_type="vector",
        args=(_real_vector("mu"), _real_vector("sigma")),
        y_data_decl="vector<lower=0>[N] y;",
        y_rep_decl="array[N] real y_rep;",
        rng="lognormal_rng({mu}, {sigma})",
        default_link="identity",
        links=("identity",),
        continuous=True,
        built_in=False,
    )
)
_register(
    Family(
        name="gamma",
        stan_name="gamma",
        suffix="lpdf",
        y_library_type="vector",
        args=(_real_vector("shape"), _real_vector("rate")),
        y_data_decl="vector<lower=0>[N] y;",
        y_rep_decl="array[N] real y_rep;",
        rng="gamma_rng({shape}, {rate})",
        default_link="log",
        links=("log",),
        continuous=True,
        built_in=False,
    )
)
_register(
    Family(
        name="weibull",
        stan_name="weibull",
        suffix="lpdf",
        y_library_type="vector",
        args=(_real_vector("shape"), _real_vector("scale")),
        y_data_decl="vector<lower=0>[N] y;",
        y_rep_decl="array[N] real y_rep;",
        rng="weibull_rng({shape}, {scale})",
        default_link="log",
        links=("log",),
        continuous=True,
        built_in=False,
    )
)
_register(
    Family(
        name="beta",
        stan_name="beta",
        suffix="lpdf",
        y_library_type="vector",
        args=(_real_vector("shape1"), _real_vector("shape2")),
        y_data_decl="vector<lower=0, upper=1>[N] y;",
        y_rep_decl="array[N] real y_rep;",
        rng="beta_rng({shape1}, {shape2})",
        default_link="logit",
        links=("logit",),
        continuous=True,
        built_in=False,
    )
)
_register(
    Family(
        name="neg_binomial_2",
        stan_name="neg_binomial_2_log",
        suffix="lpmf",
        y_library_type="array[] int",
        args=(_real_vector("eta"), _real_vector("phi")),
        y_data_decl="array[N] int<lower=0> y;",
        y_rep_decl="array[N] int y_rep;",
        rng="neg_binomial_2_log_rng({eta}, {phi})",
        default_link="log",
        links=("log",),
        continuous=False,
        built_in=False,
    )
)

_register(
    Family(
        name="beta_binomial",
        stan_name="beta_binomial",
        suffix="lpmf",
        y_library_type="array[] int",
        args=(
            _TRIALS,
            _real_vector("shape1"),
            _real_vector("shape2"),
        ),
        y_data_decl=_COUNTS_OF_TRIALS,
        y_rep_decl="array[N] int y_rep;",
        rng="beta_binomial_rng({trials}, {shape1}, {shape2})",
        default_link="logit",
        links=("logit",),
        continuous=False,
        extra_data=("trials",),
        built_in=False,
    )
)


def _ordinal(name: str) -> Family:
    """ordered_logistic or ordered_probit: a linear predictor eta and K - 1 ordered cut points c."""
    cut_points = FamilyArg("c", "vector", "array[] vector", "rep_array({name}, size(y))", "array[N] vector[K - 1] {name}",
                           shared_decl="vector[K - 1] {name}")
    return Family(
        name=name,
        stan_name=name,
        suffix="lpmf",
        y_library_type="array[] int",
        args=(_real_vector("eta"), cut_points),
        y_data_decl="int<lower=2> K;\n  array[N] int<lower=1, upper=K> y;",
        y_rep_decl="array[N] int y_rep;",
        rng=f"{name}_rng({{eta}}, {{c}})",
        default_link="logit" if name == "ordered_logistic" else "probit",
        links=("logit",) if name == "ordered_logistic" else ("probit",),
        continuous=False,
        extra_data=("K",),
        class_labels=True,
        built_in=False,
    )


_register(_ordinal("ordered_logistic"))
_register(_ordinal("ordered_probit"))


def family_of_stan_name(stan_name: str) -> Family:
    """The family whose library functions are named after ``stan_name`` (``poisson_log``, ...).

    Parameters
    ----------
    stan_name : str
        A family's :attr:`Family.stan_name`.

    Returns
    -------
    Family
        Its record.
    """
    return next(family for family in FAMILIES.values() if family.stan_name == stan_name)


def get_family(name: str, built_in: str | None = None) -> Family:
    """Look a family up by name, with an error listing the known ones.

    Parameters
    ----------
    name : str
        A key of :data:`FAMILIES`.
    built_in : str or None, default None
        The built-in model asking (``"rs.glm"``, ...): then a family it does not offer
        (``Family.built_in`` False) is refused, naming the argument and where the family is offered.

    Returns
    -------
    Family
        The family's record.
    """
    offered = sorted(n for n, f in FAMILIES.items() if f.built_in or not built_in)
    if not isinstance(name, str) or name not in FAMILIES:
        raise RobustStanInputError(f"family: unknown family {name!r}; choose one of {', '.join(offered)}")
    family = FAMILIES[name]
    if built_in and not family.built_in:
        raise RobustStanInputError(
            f"family: {built_in} does not offer the {name!r} family (it has a robust loss for rs.robustify and in "
            f"the Stan function library only); {built_in} offers {', '.join(offered)}")
    return family


# --- outcome checks ---------------------------------------------------------


def _finite_float(y: np.ndarray, what: str = "y") -> np.ndarray:
    try:
        arr = np.asarray(y, dtype=float)
    except (TypeError, ValueError) as exc:
        raise RobustStanInputError(f"{what}: must be numeric ({exc})") from None
    if not np.all(np.isfinite(arr)):
        bad = int(np.flatnonzero(~np.isfinite(arr.reshape(len(arr), -1)).any(axis=1))[0])
        raise RobustStanInputError(f"{what}: contains a non-finite value (first at row {bad})")
    return arr


#: Stan's int is 32 bits.
STAN_INT_MAX = 2**31 - 1


def _integer_labels(y: np.ndarray, what: str = "y") -> np.ndarray:
    arr = _finite_float(y, what)
    if arr.ndim != 1:
        raise RobustStanInputError(f"{what}: must be one-dimensional, got shape {arr.shape}")
    if not np.all(arr == np.round(arr)):
        raise RobustStanInputError(f"{what}: must hold whole numbers for this family")
    too_large = np.abs(arr) > STAN_INT_MAX
    if too_large.any():
        raise RobustStanInputError(f"{what}: Stan's integers hold at most {STAN_INT_MAX} "
                                   f"(row {_first_bad(too_large)} is {arr[too_large][0]:.0f})")
    return arr.astype(np.int64)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_univariate(y, data):
    arr = _finite_float(y)
    if arr.ndim != 1:
        raise RobustStanInputError(f"y: must be one-dimensional, got shape {arr.shape}")
    return arr


def _check_exponential(y, data):
    arr = _check_univariate(y, data)
    if np.any(arr < 0):
        raise RobustStanInputError(f"y: exponential outcomes must be >= 0 (row {_first_bad(arr < 0)} is {arr[arr < 0][0]})")
    return arr


def _check_positive(y, data):
    arr = _check_univariate(y, data)
    if np.any(arr <= 0):
        raise RobustStanInputError(f"y: outcomes of this family must be > 0 (row {_first_bad(arr <= 0)} is {arr[arr <= 0][0]})")
    return arr


def _check_unit_interval(y, data):
    arr = _check_univariate(y, data)
    bad = (arr <= 0) | (arr >= 1)
    if bad.any():
        raise RobustStanInputError(f"y: beta outcomes must lie in (0, 1) (row {_first_bad(bad)} is {arr[bad][0]})")
    return arr


def _check_bernoulli(y, data):
    arr = _integer_labels(y)
    bad = (arr != 0) & (arr != 1)
    if bad.any():
        raise RobustStanInputError(f"y: bernoulli outcomes must be 0 or 1 (row {_first_bad(bad)} is {arr[bad][0]})")
    return arr


def _check_counts(y, data):
    arr = _integer_labels(y)
    if np.any(arr < 0):
        raise RobustStanInputError(f"y: counts must be >= 0 (row {_first_bad(arr < 0)} is {arr[arr < 0][0]})")
    return arr


def _check_binomial(y, data):
    arr = _check_counts(y, data)
    if "trials" not in data:
        raise RobustStanInputError("trials: the binomial family needs data['trials'], the number of trials per row")
    trials = _integer_labels(data["trials"], "trials")
    if trials.shape != arr.shape:
        raise RobustStanInputError(f"trials: shape {trials.shape} does not match y's {arr.shape}")
    if np.any(trials < 0):
        raise RobustStanInputError("trials: must be >= 0")
    if np.any(arr > trials):
        raise RobustStanInputError(f"y: row {_first_bad(arr > trials)} has more successes than trials")
    return arr


def _check_categorical(y, data):
    arr = _integer_labels(y)
    if "K" not in data:
        raise RobustStanInputError("K: the categorical family needs data['K'], the number of classes")
    K = int(data["K"])
    if data.get("K_inferred") and arr.size and len(np.unique(arr)) < 2:
        raise RobustStanInputError(f"y: every row is class {arr[0]}; the number of classes is taken from "
                                   "max(y), so give data['K'] (the number of classes) explicitly")
    if K < 2:
        raise RobustStanInputError(f"K: needs at least 2 classes, got {K}")
    bad = (arr < 1) | (arr > K)
    if bad.any():
        raise RobustStanInputError(f"y: classes must be in 1..K={K} (row {_first_bad(bad)} is {arr[bad][0]})")
    return arr


def _check_multi_normal(y, data):
    arr = _finite_float(y)
    if arr.ndim != 2:
        raise RobustStanInputError(f"y: multi_normal outcomes must be an (N, D) array, got shape {arr.shape}")
    return arr


_OUTCOME_CHECKS = {
    "normal": _check_univariate,
    "student_t": _check_univariate,
    "exponential": _check_exponential,
    "bernoulli": _check_bernoulli,
    "binomial": _check_binomial,
    "poisson": _check_counts,
    "categorical": _check_categorical,
    "multi_normal": _check_multi_normal,
    "lognormal": _check_positive,
    "gamma": _check_positive,
    "weibull": _check_positive,
    "beta": _check_unit_interval,
    "neg_binomial_2": _check_counts,
    "beta_binomial": _check_binomial,
    "ordered_logistic": _check_categorical,
    "ordered_probit": _check_categorical,
}
