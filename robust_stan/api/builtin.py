"""Built-in models (location and glm) and custom specifications.

Each returns a :class:`~robust_stan.Model`. Priors are Stan statements;
the defaults (stated per family below) are weakly informative on the scale the
model is fitted on: continuous outcomes are standardised by default (normal,
student_t: minus the median, divided by 1.4826 x MAD; exponential: divided by
the median), and results are reported on the original scale. Changing a prior
changes the program and so compiles it once more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..building.families import FAMILIES, SCALE_PRIOR, get_family
from ..building.formulas import ParsedFormula, parse_formula
from ..building.group_terms import GroupTermStan
from ..building.spec import FLIP_RATE, Argument, LinearPredictor, ModelSpec, ParameterDeclaration, split_statements
from ..common.errors import RobustStanInputError
from .model import Model


def _merge_priors(defaults: dict[str, str], priors: dict[str, str] | None, names: list[str]) -> str:
    priors = dict(priors or {})
    unknown = sorted(set(priors) - set(names))
    if unknown:
        raise RobustStanInputError(f"priors: unknown parameter(s) {unknown}; this model has {names}")
    merged = {**defaults, **priors}
    lines: list[str] = []
    for name in names:
        statement = merged[name].strip()
        if "~" in statement or "target" in statement or ";" in statement:
            lines.extend(s.strip() + ";" for s in statement.split(";") if s.strip())
        else:  # a bare distribution, e.g. "normal(0, 1)"
            lines.append(f"{name} ~ {statement};")
    return "\n".join(lines)


def _builtin_model(kind, fam, data, decls, defaults, priors, args, rescale, standardize, engine, title,
                   transformed_data="", linear_predictor=None, known=None, known_rescale=None, formula=None,
                   standardize_as="family", fixed_priors=()) -> Model:
    """``standardize_as``: the outcome's standardisation when ``standardize`` (the family's by default);
    ``fixed_priors``: statements after the merged priors that a user cannot replace (parameters named
    in them are left out of the names ``priors`` may use)."""
    params = [ParameterDeclaration.parse(d) for d in decls]
    fixed = [name for name, _ in fixed_priors]
    if priors and set(priors) & set(fixed):
        raise RobustStanInputError(
            f"priors: {sorted(set(priors) & set(fixed))} are the standard-normal parameters of the group-level "
            "terms' non-centred parameterisation (effects = diag(sd) L z), whose prior is not replaceable; "
            "replace the sd_<term> or L_<term> priors instead")
    merged = _merge_priors(defaults, priors, [p.name for p in params if p.name not in fixed])
    mode = (fam.standardize if standardize_as == "family" else standardize_as) if standardize else None
    spec = ModelSpec(
        transformed_data=transformed_data,
        family=fam,
        data=data,
        parameters=params,
        priors="\n".join([merged, *(statement for _, statement in fixed_priors)]),
        args=args,
        title=title,
        standardize=mode,
        rescale=rescale if mode else {},
        linear_predictor=linear_predictor,
        known=dict(known or {}),
        known_rescale=dict(known_rescale or {}) if mode else {},
        formula=formula,
    )
    return Model(spec, engine=engine, kind=kind)


def location(
    family: str,
    *,
    known: dict[str, float] | None = None,
    covariance: str = "estimated",
    priors: dict[str, str] | None = None,
    standardize: bool = True,
    engine: str = "auto",
) -> Model:
    """A location model: y_i ~ family(theta), one location (and scale) shared by every observation.

    Parameters and default priors (fitted scale): normal: mu ~ normal(0, 10), sigma ~
    exponential(1); student_t: the same and nu ~ gamma(2, 0.1); bernoulli, binomial: alpha (logit)
    ~ normal(0, 2.5); poisson: alpha (log rate) ~ normal(0, 5); categorical: alpha[K-1] (logits
    against class 1) ~ normal(0, 2.5); multi_normal: mu[D] ~ normal(0, 10) with tau[D] ~
    exponential(1), L_Omega ~ lkj_corr_cholesky(2), or data['Sigma'] (D x D) when the covariance is
    known; exponential: rate ~ lognormal(0, 2.5). The mislabelling likelihood of :func:`glm` is not
    offered: with one probability shared by every row, the flip rate and alpha are not identified.

    Parameters
    ----------
    family : str
        The likelihood, as for :func:`glm`.
    known : dict of float or None, default None
        Fixed values: ``{"sigma": 1.0}`` (normal, student_t) fixes the scale, in the units of y;
        ``{"nu": 4}`` fixes student_t's degrees of freedom. They are passed as data, so one
        compiled program serves every value; with the outcome standardised, sigma is divided by
        the same scale as y. Giving the same name in the data too is an error.
    covariance : {"estimated", "known"}, default "estimated"
        multi_normal only: estimate the covariance or read it from data['Sigma'].
    priors : dict of str or None, default None
        Replacement priors by parameter name, e.g. ``{"mu": "normal(0, 1)"}``.
    standardize, engine
        As for :func:`glm`.

    Returns
    -------
    Model
        The location model, compiled on first use.

    Raises
    ------
    RobustStanInputError
        If the family is unknown or ``known`` names a parameter the family does not have.
    """
    fam = get_family(family, built_in="rs.location")
    known = _checked_known(known)
    data_lines: list[str] = []
    transformed_data = ""
    rescale: dict[str, str] = {}
    if fam.location_scale:  # normal, student_t
        decls, defaults = ["real mu"], {"mu": "normal(0, 10)"}
        args = {"mu": Argument("mu", "mu")}
        rescale["mu"] = "location"
        fixable = [("sigma", "real<lower=0> sigma", SCALE_PRIOR), *fam.shape_parameters]
        for name, decl, prior in fixable:
            if name in known:
                data_lines.append(decl)  # a known value is data with the parameter's bounds
            else:
                decls.append(decl)
                defaults[name] = prior
            args[name] = Argument(name, name)
        if "sigma" not in known:
            rescale["sigma"] = "scale"
        if set(known) - {name for name, _, _ in fixable}:
            raise RobustStanInputError(f"known: the {fam.name} location model can fix only "
                                       + " and ".join(name for name, _, _ in fixable))
    elif fam.class_labels:  # categorical
        decls, defaults = ["vector[K - 1] alpha"], {"alpha": fam.intercept_prior}
        args = {"eta": Argument("eta", "append_col(0, alpha')")}
    elif fam.multivariate:  # multi_normal
        decls, defaults = ["vector[D] mu"], {"mu": "normal(0, 10)"}
        if covariance == "estimated":
            decls += ["vector<lower=0>[D] tau", "cholesky_factor_corr[D] L_Omega"]
            defaults.update(tau=SCALE_PRIOR, L_Omega="lkj_corr_cholesky(2)")
            args = {"mu": Argument("mu", "mu"), "L": Argument("L", "diag_pre_multiply(tau, L_Omega)")}
        elif covariance == "known":
            data_lines.append("cov_matrix[D] Sigma")
            transformed_data = "matrix[D, D] L_Sigma = cholesky_decompose(Sigma);"  # once, not per draw
            args = {"mu": Argument("mu", "mu"), "L": Argument("L", "L_Sigma")}
        else:
            raise RobustStanInputError(f"covariance: must be 'estimated' or 'known', got {covariance!r}")
    elif fam.positive_rate:  # exponential: the rate moves inversely with y's scale
        decls, defaults = ["real<lower=0> rate"], {"rate": "lognormal(0, 2.5)"}
        args = {"rate": Argument("rate", "rate")}
        rescale["rate"] = "inverse_scale"
    else:  # bernoulli, binomial, poisson: one linear-predictor argument eta
        decls = ["real alpha"]
        defaults = {"alpha": fam.intercept_prior}
        args = {"eta": Argument("eta", "alpha")}
    if known and not fam.location_scale:
        raise RobustStanInputError(f"known: the {fam.name} location model has no fixable parameters")
    return _builtin_model("location", fam, "; ".join(data_lines), decls, defaults, priors, args, rescale,
                          standardize, engine, f"robust-stan location model, family {fam.name}", transformed_data,
                          known=known, known_rescale={"sigma": "scale"} if "sigma" in known else {})


def _checked_known(known) -> dict[str, float]:
    """``known`` as {name: float}: sigma positive, nu at least 1 (the bound the program declares)."""
    if known is None:
        return {}
    if not isinstance(known, Mapping):
        raise RobustStanInputError(f"known: expected a dict such as {{'sigma': 1.0}}, got {type(known).__name__}")
    out = {}
    for name, value in known.items():
        if name == "nu":
            low, what = 1.0, "a number >= 1 (the model declares nu >= 1)"
        else:
            low, what = 0.0, "a positive number"
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RobustStanInputError(f"known: {name} must be {what}, got {value!r}") from None
        if isinstance(value, bool) or not math.isfinite(number) or number < low or (low == 0.0 and number == 0.0):
            raise RobustStanInputError(f"known: {name} must be {what}, got {value!r}")
        out[name] = number
    return out


def glm(
    family: str,
    *,
    formula: str | None = None,
    link: str | None = None,
    mislabel: bool = False,
    priors: dict[str, str] | None = None,
    standardize: bool = True,
    engine: str = "auto",
) -> Model:
    """A generalised linear model: y_i ~ family(link^-1(alpha + x_i' b), extra parameters).

    The data are ``X`` (N x P; a DataFrame's column names name the coefficients) and ``y``, or
    with ``formula`` a data frame holding the columns the formula reads. Links: normal, student_t,
    multi_normal identity; bernoulli, binomial logit; poisson log; categorical softmax (class 1 is
    the reference: alpha[K-1], B[P, K-1]); exponential log (the mean is exp(alpha + x'b)).
    multi_normal: alpha[D], B[P, D], covariance diag(tau) L_Omega. Default priors (fitted scale):
    alpha ~ normal(0, 2.5); b_j ~ normal(0, prior_scale_b[j]) with prior_scale_b[j] = 2.5 /
    sd(X[:, j]) unless data['prior_scale_b'] is given; sigma, tau ~ exponential(1); nu ~ gamma(2,
    0.1); L_Omega ~ lkj_corr_cholesky(2).

    With a formula (``"y ~ x1 + C(g) + (1 + x1 | school)"``; the user guide's page on the built-in
    models says what it may hold) the design matrix is formulaic's, without the intercept column (the
    model's ``alpha``; ``0 +`` removes it), and each group-level term ``s`` (its grouping factor's
    name made a Stan identifier) adds to row n's linear predictor ``Z_s[n] u_s[:, level of n]``,
    the effects ``u_s = diag(sd_s) L_s z_s`` non-centred: ``z_s ~ std_normal()`` (not replaceable),
    ``sd_s ~ exponential(1)`` and, for correlated coefficients (``|``, not ``||``), ``L_s ~
    lkj_corr_cholesky(2)``. The robust loss applies to the observations; the group distribution is
    part of the prior. The program depends on the formula only through the family, the intercept and
    each term's name and kind, so formulas differing in their columns share one compiled program.
    A binomial outcome gives its trials as ``y | trials(n) ~ ...``. Without an intercept a
    continuous outcome is divided by its spread but not centred (normal, student_t) or not
    standardised (exponential), so that the model stays the one written.

    Parameters
    ----------
    family : str
        The likelihood: "normal", "student_t", "bernoulli", "binomial", "poisson",
        "categorical", "multi_normal" or "exponential".
    formula : str or None, default None
        A Wilkinson formula; None: the data are ``X`` and ``y``. Group-level terms are for the
        families with one linear predictor per row (not categorical or multi_normal).
    link : str, optional
        The link function; the family's default (above) when omitted.
    mislabel : bool, default False
        bernoulli and categorical only: the mislabelling likelihood, in which each observed label
        is the true one with probability 1 - flip_rate and each of the other K - 1 classes with
        probability flip_rate / (K - 1). Use it when labels are flipped at random (a
        misspecification no beta or gamma removes). ``flip_rate`` lies below its identification
        bound (1/2 for bernoulli, (K - 1)/K for categorical) with a uniform prior up to it;
        replace that through ``priors``, e.g. ``{"flip_rate": "beta(1, 9)"}``. Every divergence
        and method applies.
    priors : dict of str, optional
        Replacement priors by parameter name, e.g. ``{"alpha": "normal(0, 1)"}`` or
        ``{"sd_school": "normal(0, 1)"}`` (the standard-normal ``z_<term>`` are not replaceable).
    standardize : bool, default True
        Standardise a continuous outcome before fitting (results on the original scale).
    engine : str, default "auto"
        "cmdstan" or "httpstan"; "auto" takes $ROBUST_STAN_ENGINE, else the one installed.

    Returns
    -------
    Model
        The model, compiled on first use.

    Raises
    ------
    RobustStanInputError
        If the family, link or a prior's name is unknown, ``mislabel`` is asked of another
        family, or the formula cannot be read or asks what the family does not have.
    """
    if isinstance(family, str) and "~" in family:
        raise RobustStanInputError(f"family: got the formula {family!r}; write rs.glm(family, formula={family!r}) "
                                   "and give the data frame to the model's methods (model.sample(df, ...))")
    fam = get_family(family, built_in="rs.glm")
    link = link or fam.default_link
    if link not in fam.links:
        raise RobustStanInputError(f"link: the {fam.name} family supports {list(fam.links)}, not {link!r}")
    if not isinstance(mislabel, bool):
        raise RobustStanInputError(f"mislabel: must be True or False, got {mislabel!r}")
    if mislabel and not fam.mislabel_bound:
        supported = sorted(name for name, f in FAMILIES.items() if f.mislabel_bound)
        raise RobustStanInputError(f"mislabel: the mislabelling likelihood is for the {' and '.join(supported)} "
                                   f"families (labels), not {fam.name}")
    parsed = _checked_formula(formula, fam)
    intercept = parsed is None or parsed.intercept
    groups = [] if parsed is None else [GroupTermStan(name, term.correlated)
                                        for name, term in zip(parsed.group_stan_names, parsed.groups)]
    data = "; ".join(["int<lower=0> P; matrix[N, P] X; vector<lower=0>[P] prior_scale_b",
                      *(line for term in groups for line in term.data)])
    rescale: dict[str, str] = {}
    b_prior = "normal(0, prior_scale_b)"
    linear_predictor = None
    standardize_as = fam.standardize
    if fam.class_labels:  # categorical
        decls = ["vector[K - 1] alpha", "matrix[P, K - 1] B"]
        defaults = {"alpha": "normal(0, 2.5)", "B": "for (k in 1:(K - 1)) B[:, k] ~ normal(0, prior_scale_b)"}
        args = {
            "eta": Argument(
                "eta",
                "append_col(0, alpha' + X[n] * B)",
                "append_col(rep_vector(0, N), rep_matrix(alpha', N) + X * B)",
            )
        }
    elif fam.multivariate:  # multi_normal
        decls = ["vector[D] alpha", "matrix[P, D] B", "vector<lower=0>[D] tau", "cholesky_factor_corr[D] L_Omega"]
        defaults = {
            "alpha": "normal(0, 2.5)",
            "B": "for (d in 1:D) B[:, d] ~ normal(0, prior_scale_b)",
            "tau": SCALE_PRIOR,
            "L_Omega": "lkj_corr_cholesky(2)",
        }
        args = {
            "mu": Argument("mu", "alpha + (X[n] * B)'"),
            "L": Argument("L", "diag_pre_multiply(tau, L_Omega)"),
        }
    else:
        decls = (["real alpha"] if intercept else []) + ["vector[P] b"]
        defaults = {"alpha": "normal(0, 2.5)", "b": b_prior} if intercept else {"b": b_prior}
        for term in groups:
            decls += term.parameters
            defaults.update(term.default_priors)
        start = ["alpha"] if intercept else []
        linear = " + ".join(start + ["X[n] * b"] + [term.per_observation for term in groups])
        linear_vec = " + ".join(start + ["X * b"] + [term.vectorised for term in groups])
        # mode 3's chain rule covers the coefficients b only: with group effects or no intercept, copies
        lp_possible = intercept and not groups
        if fam.location_scale:  # normal, student_t
            decls.append("real<lower=0> sigma")
            defaults["sigma"] = SCALE_PRIOR
            args = {"mu": Argument("mu", linear, linear_vec), "sigma": Argument("sigma", "sigma")}
            rescale.update(alpha="location", b="scale", sigma="scale")
            if not intercept:  # no intercept to take the centre: divide by the spread only
                standardize_as = "spread"
                del rescale["alpha"]
            # a shape parameter (student_t's nu) cannot vary by row in the library, so no mode 3
            linear_predictor = None if fam.shape_parameters or not lp_possible else LinearPredictor("mu")
            for name, decl, prior in fam.shape_parameters:
                decls.append(decl)
                defaults[name] = prior
                args[name] = Argument(name, name)
        elif fam.positive_rate:  # exponential: the mean is exp(alpha + x'b), the rate its inverse
            args = {"rate": Argument("rate", f"exp(-({linear}))", f"exp(-({linear_vec}))")}
            rescale.update(alpha="log_scale")
            if not intercept:  # no intercept to take log(scale): the outcome as given
                standardize_as = None
            linear_predictor = LinearPredictor("rate", "exp(-({eta}))") if lp_possible else None
        else:
            args = {"eta": Argument("eta", linear, linear_vec)}
            linear_predictor = LinearPredictor("eta") if lp_possible else None
        for term in groups:
            rescale.update(term.rescale(rescale.get("b")))
    title = f"robust-stan glm, family {fam.name}, link {link}"
    if not intercept:
        title += ", no intercept"
    if groups:
        title += ", group-level terms " + ", ".join(
            term.name + ("" if term.correlated else " (independent)") for term in groups)
    if mislabel:
        decls.append(f"real<lower=0, upper={fam.mislabel_bound}> {FLIP_RATE}")
        defaults[FLIP_RATE] = f"uniform(0, {fam.mislabel_bound})"
        args = {name: Argument(name, fam.mislabelled(arg.per_observation, FLIP_RATE),
                               arg.vectorised and fam.mislabelled(arg.vectorised, FLIP_RATE))
                for name, arg in args.items()}
        if linear_predictor is not None:
            linear_predictor = LinearPredictor(linear_predictor.argument,
                                               fam.mislabelled(linear_predictor.of_eta, "{" + FLIP_RATE + "}"))
        title += ", mislabelled labels"
    return _builtin_model("glm", fam, data, decls, defaults, priors, args, rescale, standardize, engine, title,
                          linear_predictor=linear_predictor, formula=parsed, standardize_as=standardize_as,
                          fixed_priors=[(f"z_{term.name}", term.standard_normal) for term in groups])


def _checked_formula(formula, fam) -> ParsedFormula | None:
    """The formula read, or None; what the family cannot take of it is refused by name."""
    if formula is None:
        return None
    parsed = parse_formula(formula)
    if parsed.outcome is None:
        raise RobustStanInputError(f"formula: {formula!r} has no outcome; write it as 'y ~ ...'")
    if fam.multivariate:
        raise RobustStanInputError(f"formula: the {fam.name} glm's outcome is a matrix (N, D), which a formula's "
                                   "one outcome column cannot give; pass {'X': X, 'y': Y} without formula")
    if parsed.groups and fam.class_labels:
        raise RobustStanInputError(
            f"formula: group-level terms ({', '.join(term.text for term in parsed.groups)}) are not offered for the "
            f"{fam.name} family, whose linear predictor is a row per class; write them with rs.custom")
    if not parsed.intercept and fam.class_labels:
        raise RobustStanInputError(f"formula: the {fam.name} glm has an intercept per class; a formula without one "
                                   "('0 +' or '- 1') is not offered for it")
    if "trials" in fam.extra_data and parsed.trials is None:
        raise RobustStanInputError(f"formula: a {fam.name} outcome needs its numbers of trials: write "
                                   f"'{parsed.outcome} | trials(n) ~ ...' with n the column holding them")
    if parsed.trials is not None and "trials" not in fam.extra_data:
        raise RobustStanInputError(f"formula: '| trials({parsed.trials})' is for a binomial outcome, not {fam.name}")
    return parsed


def custom(
    family: str,
    *,
    data: str = "",
    transformed_data: str = "",
    parameters: str,
    priors: str = "",
    engine: str = "auto",
    title: str | None = None,
    vectorised: dict[str, str] | None = None,
    **args: str,
) -> Model:
    """A model from your own Stan fragments and one of the built-in likelihood families.

    For example, a hierarchical regression::

        rs.custom("normal",
                  data="int<lower=1> P; matrix[N, P] X; int<lower=1> G; array[N] int<lower=1, upper=G> g;",
                  parameters="vector[P] b; vector[G] u; real<lower=0> tau; real<lower=0> sigma;",
                  priors="b ~ normal(0, 5); u ~ normal(0, tau); tau ~ exponential(1); sigma ~ exponential(1);",
                  mu="X[n] * b + u[g[n]]", sigma="sigma")

    ``N`` and ``y`` (and ``trials``/``K``/``D`` for binomial/categorical/multi_normal) are declared
    for you. Outcomes are used as given (no standardisation): mind the units, since the beta and
    gamma losses are not invariant to them.

    Parameters
    ----------
    family : str
        The likelihood family, a key of :data:`robust_stan.FAMILIES`.
    data : str, default ""
        Stan declarations of the data beyond ``N`` and ``y``.
    transformed_data : str, default ""
        Stan statements run once on the data (e.g. ``"matrix[P, P] L = cholesky_decompose(S);"``),
        not once per draw.
    parameters : str
        Stan declarations of the parameters.
    priors : str, default ""
        Stan statements of the priors.
    engine : str, default "auto"
        "cmdstan" or "httpstan"; "auto" takes $ROBUST_STAN_ENGINE, else the one installed.
    title : str or None, default None
        A name for the model in messages and the generated program's header.
    vectorised : dict of str or None, default None
        Per family argument, one Stan expression for all N rows at once (e.g. ``{"mu": "X * b"}``);
        the posterior mode then evaluates that instead of a loop over rows. The per-observation
        form is still used per example; the two must agree.
    **args : str
        The family's arguments (``mu="X[n] * b"``, ``sigma="sigma"``, ...), each a Stan expression
        for observation ``n``; one without ``n`` is shared by all rows.

    Returns
    -------
    Model
        Your model, compiled when first used.

    Raises
    ------
    RobustStanInputError
        If the family is unknown or an argument it needs is missing.
    """
    fam = get_family(family, built_in="rs.custom")
    vectorised = dict(vectorised or {})
    unknown = sorted(set(vectorised) - set(args))
    if unknown:
        raise RobustStanInputError(f"vectorised: {unknown} are not arguments given to this model ({sorted(args)})")
    if not isinstance(parameters, str) or not parameters.strip():
        raise RobustStanInputError("parameters: give at least one Stan parameter declaration")
    spec = ModelSpec(
        family=fam,
        data=data,
        parameters=[ParameterDeclaration.parse(s) for s in split_statements(parameters)],
        priors=priors,  # kept line for line, so stanc errors map to the user's own lines
        args={name: Argument(name, expr, vectorised.get(name)) for name, expr in args.items()},
        title=title or f"robust-stan custom model, family {fam.name}",
        parameters_text=parameters,
        transformed_data=transformed_data,
    )
    return Model(spec, engine=engine, kind="custom")
