"""The Stan fragments of a formula's group-level terms, for a generated program: their data, their
non-centred parameters, default priors, and their part of the linear predictor.

A term ``s`` with K varying coefficients over G levels has the data ``G_s``, ``K_s``, ``J_s`` (each
row's level, 1-based) and ``Z_s`` (N x K, each row's columns of the coefficients;
:func:`robust_stan.building.formulas.design_stan_data` gives them), and the parameters

- ``z_s`` (K x G), standard normal: the non-centred effects;
- ``sd_s`` (K), positive: the coefficients' standard deviations across levels;
- ``L_s`` (K x K), correlated terms only: the Cholesky factor of their correlation, LKJ;

so that the effects are ``u_s = diag(sd_s) L_s z_s`` (K x G, column l those of level l; a
multivariate normal with covariance diag(sd_s) L_s L_s' diag(sd_s) whatever the data), and row n
adds ``Z_s[n] * u_s[:, J_s[n]]`` to its linear predictor. The robust loss applies to the rows; the
group distribution is part of the prior. Only ``sd_s`` moves with a standardised outcome's scale,
as the coefficients do (:meth:`GroupTermStan.rescale`).

"""

from __future__ import annotations

from dataclasses import dataclass

from .families import SCALE_PRIOR

#: The default prior of a correlated term's Cholesky factor: LKJ(2), mildly towards no correlation.
CORRELATION_PRIOR = "lkj_corr_cholesky(2)"


@dataclass(frozen=True)
class GroupTermStan:
    """One group-level term's part of a generated program.

    Parameters
    ----------
    name : str
        The term's Stan name ``s`` (:attr:`~robust_stan.building.formulas.ParsedFormula.group_stan_names`).
    correlated : bool
        Whether its coefficients are correlated (``|``; an LKJ Cholesky factor) or independent (``||``).
    """

    name: str
    correlated: bool = True

    @property
    def data(self) -> tuple[str, ...]:
        """Stan declarations of the term's data (tuple of str)."""
        s = self.name
        return (f"int<lower=1> G_{s}", f"int<lower=1> K_{s}", f"array[N] int<lower=1, upper=G_{s}> J_{s}",
                f"matrix[N, K_{s}] Z_{s}")

    @property
    def parameters(self) -> tuple[str, ...]:
        """Stan declarations of the term's parameters (tuple of str)."""
        s = self.name
        declarations = (f"matrix[K_{s}, G_{s}] z_{s}", f"vector<lower=0>[K_{s}] sd_{s}")
        return declarations + ((f"cholesky_factor_corr[K_{s}] L_{s}",) if self.correlated else ())

    @property
    def default_priors(self) -> dict[str, str]:
        """Default priors of the parameters a user may replace by name: ``sd_s`` and ``L_s`` (dict)."""
        priors = {f"sd_{self.name}": SCALE_PRIOR}
        if self.correlated:
            priors[f"L_{self.name}"] = CORRELATION_PRIOR
        return priors

    @property
    def standard_normal(self) -> str:
        """The prior statement of ``z_s``, part of the non-centred parameterisation, not replaceable (str)."""
        return f"to_vector(z_{self.name}) ~ std_normal();"

    def rescale(self, coefficient_rule: str | None) -> dict[str, str]:
        """How the parameters return to a standardised outcome's units: ``sd_s`` as the population-level
        coefficients do (a scale for normal and student_t; nothing under a log link, where the
        outcome's scale moves the intercept only).

        Parameters
        ----------
        coefficient_rule : str or None
            The rule of the coefficients ``b`` (``ModelSpec.rescale["b"]``), None when they stay as fitted.

        Returns
        -------
        dict
            ``{"sd_s": rule}``, or empty.
        """
        return {f"sd_{self.name}": coefficient_rule} if coefficient_rule else {}

    @property
    def per_observation(self) -> str:
        """Stan expression of row ``n``'s part of the linear predictor (str)."""
        s = self.name
        column = f"col(z_{s}, J_{s}[n])"
        scaled = f"diag_pre_multiply(sd_{s}, L_{s}) * {column}" if self.correlated else f"sd_{s} .* {column}"
        return f"Z_{self.name}[n] * ({scaled})"

    @property
    def vectorised(self) -> str:
        """Stan expression of every row's part of the linear predictor, a vector[N] (str): row n of
        ``Z_s diag(sd_s) L_s`` times the column of ``z_s`` of row n's level (Stan indexes names, not
        bracketed expressions)."""
        s = self.name
        scaled = f"Z_{s} * diag_pre_multiply(sd_{s}, L_{s})" if self.correlated else f"diag_post_multiply(Z_{s}, sd_{s})"
        return f"rows_dot_product({scaled}, z_{s}[:, J_{s}]')"
