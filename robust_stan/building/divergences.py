"""Divergences: which loss replaces the log-likelihood (DESIGN.md section 2).

Each divergence becomes two numbers of program data, a code and a parameter,
so switching divergence never recompiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.errors import RobustStanInputError, require_positive


@dataclass(frozen=True)
class Divergence:
    """Base class: ``code`` and ``param`` are what the Stan program reads."""

    code: int = 0
    param: float = 0.0

    @property
    def label(self) -> str:
        return "KL"

    def stan_data(self) -> dict:
        # The program ignores the parameter under KL; 1.0 keeps it a valid positive real.
        return {"divergence": self.code, "divergence_param": self.param if self.code else 1.0}


class KL(Divergence):
    """Ordinary Bayes: l_i = -log p(y_i | theta)."""

    def __init__(self):
        super().__init__(0, 0.0)

    def __repr__(self) -> str:
        return "KL()"


class BetaD(Divergence):
    """Beta-divergence (density power) loss with parameter ``beta`` > 0.

    l_i = -(1/beta) p_i^beta + I_beta / (1 + beta). Futami et al.'s beta-VI
    loss is this times (1 + beta), i.e. learning rate 1 + beta.
    """

    def __init__(self, beta: float):
        super().__init__(1, require_positive("beta", beta))

    @property
    def beta(self) -> float:
        return self.param

    @property
    def label(self) -> str:
        return f"beta={self.param:g}"

    def __repr__(self) -> str:
        return f"BetaD({self.param:g})"


class GammaD(Divergence):
    """Gamma-divergence loss with parameter ``gamma`` > 0.

    ``form="decomposable"`` (default, Futami eq. 15) is a sum over
    observations; ``form="original"`` is Fujisawa and Eguchi's log-ratio form.
    """

    FORMS = {"decomposable": 2, "original": 3}

    def __init__(self, gamma: float, form: str = "decomposable"):
        if form not in self.FORMS:
            raise RobustStanInputError(f"form: must be 'decomposable' or 'original', got {form!r}")
        super().__init__(self.FORMS[form], require_positive("gamma", gamma))

    @property
    def gamma(self) -> float:
        return self.param

    @property
    def form(self) -> str:
        return "decomposable" if self.code == 2 else "original"

    @property
    def label(self) -> str:
        return f"gamma={self.param:g}" + ("" if self.code == 2 else " (original)")

    def __repr__(self) -> str:
        return f"GammaD({self.param:g}, form={self.form!r})"


def as_divergence(value) -> Divergence:
    """Accept a Divergence, or None for KL; anything else is an error naming the argument."""
    if value is None:
        return KL()
    if isinstance(value, Divergence):
        return value
    raise RobustStanInputError(
        f"divergence: expected rs.KL(), rs.BetaD(beta) or rs.GammaD(gamma), got {value!r}"
    )
