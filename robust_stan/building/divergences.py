"""Divergences: which loss replaces the log-likelihood.

The generalized posterior is pi(theta) propto prior(theta) exp(-w sum_i v_i l_i(theta)), with
learning rate w, row weights v_i and, with p_i = p(y_i | theta) and I_a = the integral of
p(y | theta)^(1 + a) over the outcome space, the loss l_i of each divergence:

- KL: l_i = -log p_i (the ordinary posterior);
- beta: l_i = -p_i^beta / beta + I_beta / (1 + beta) (Ghosh and Basu 2016; Futami et al. write
  (1 + beta) times it, so their posterior is this one with w = 1 + beta);
- gamma (decomposable): l_i = -((1 + gamma) / gamma) p_i^gamma / I_gamma^(gamma / (1 + gamma));
- gamma (original, Fujisawa and Eguchi), not a sum over rows: with V = sum_i v_i, the total
  L = -(V / gamma) log(sum_i v_i p_i^gamma / V) + (V / (1 + gamma)) log(sum_i v_i I_i / V).

Each divergence becomes two numbers of program data, a code and a parameter,
so switching divergence never recompiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from ..common.errors import RobustStanInputError, require_positive


class DivergenceCode(IntEnum):
    """The program's ``divergence`` switch (``rs_divergence`` in a robustified program)."""

    KL = 0
    BETA = 1
    GAMMA = 2  # the decomposable form, a sum over observations
    GAMMA_ORIGINAL = 3  # Fujisawa and Eguchi's log-ratio form, not a sum over observations


#: Why the original gamma form is refused wherever rows are taken one at a time.
NOT_A_SUM = "the original gamma form is not a sum over observations"


def refuse_original_gamma(divergence, argument: str, consequence: str,
                          remedy: str = "use rs.GammaD(gamma) (decomposable), rs.BetaD or rs.KL()") -> None:
    """Raise a RobustStanInputError naming ``argument`` when ``divergence`` (a
    :class:`Divergence` or a program's divergence code) is the original gamma form.

    Parameters
    ----------
    divergence : Divergence or int
        The divergence, or the code a program's data hold.
    argument : str
        The argument the error names.
    consequence : str
        What the caller cannot do, completing "not a sum over observations, so ...".
    remedy : str, optional
        What to use instead.
    """
    code = divergence.code if isinstance(divergence, Divergence) else int(divergence)
    if code == DivergenceCode.GAMMA_ORIGINAL:
        raise RobustStanInputError(f"{argument}: {NOT_A_SUM}, so {consequence}; {remedy}")


@dataclass(frozen=True)
class Divergence:
    """Base class of the divergences: ``code`` and ``param`` are what the Stan program reads.

    Parameters
    ----------
    code : DivergenceCode, default DivergenceCode.KL
        The program's ``divergence`` switch.
    param : float, default 0.0
        The divergence's parameter (beta or gamma; unused for KL).
    """

    code: DivergenceCode = DivergenceCode.KL
    param: float = 0.0

    @property
    def label(self) -> str:
        """A short label such as ``beta=0.3``, for tables and plots (str)."""
        return "KL"

    def stan_data(self) -> dict:
        """The program's switches for this divergence.

        Returns
        -------
        dict
            ``divergence`` (the code) and ``divergence_param``.
        """
        # The program ignores the parameter under KL; 1.0 keeps it a valid positive real.
        return {"divergence": int(self.code),
                "divergence_param": self.param if self.code != DivergenceCode.KL else 1.0}


class KL(Divergence):
    """Ordinary Bayes: l_i = -log p(y_i | theta)."""

    def __init__(self):
        super().__init__(DivergenceCode.KL, 0.0)

    def __repr__(self) -> str:
        return "KL()"


class BetaD(Divergence):
    """Beta-divergence (density power) loss with parameter ``beta`` > 0.

    l_i = -(1/beta) p_i^beta + I_beta / (1 + beta). The beta-VI loss of Futami, Sato and
    Sugiyama (2018, arXiv:1710.06595) is this times (1 + beta), i.e. learning rate 1 + beta.

    Parameters
    ----------
    beta : float
        The power, > 0; larger values down-weight poorly fitted observations more.

    Raises
    ------
    RobustStanInputError
        If ``beta`` is not a positive number.
    """

    def __init__(self, beta: float):
        super().__init__(DivergenceCode.BETA, require_positive("beta", beta))

    @property
    def beta(self) -> float:
        """The power beta (float)."""
        return self.param

    @property
    def label(self) -> str:
        """``beta=<value>`` (str)."""
        return f"beta={self.param:g}"

    def __repr__(self) -> str:
        return f"BetaD({self.param:g})"


class GammaD(Divergence):
    """Gamma-divergence loss with parameter ``gamma`` > 0.

    Parameters
    ----------
    gamma : float
        The power, > 0.
    form : {"decomposable", "original"}, default "decomposable"
        "decomposable" (eq. 15 of Futami, Sato and Sugiyama 2018, arXiv:1710.06595) is a sum
        over observations; "original" is Fujisawa and Eguchi's (2008) log-ratio form, which is
        not, so methods that need a sum refuse it.

    Raises
    ------
    RobustStanInputError
        If ``gamma`` is not a positive number or ``form`` is unknown.
    """

    FORMS: ClassVar[dict[str, DivergenceCode]] = {"decomposable": DivergenceCode.GAMMA,
                                                  "original": DivergenceCode.GAMMA_ORIGINAL}

    def __init__(self, gamma: float, form: str = "decomposable"):
        if form not in self.FORMS:
            raise RobustStanInputError(f"form: must be 'decomposable' or 'original', got {form!r}")
        super().__init__(self.FORMS[form], require_positive("gamma", gamma))

    @property
    def gamma(self) -> float:
        """The power gamma (float)."""
        return self.param

    @property
    def form(self) -> str:
        """The form, "decomposable" or "original" (str)."""
        return "decomposable" if self.code == DivergenceCode.GAMMA else "original"

    @property
    def label(self) -> str:
        """``gamma=<value>``, marked ``(original)`` for that form (str)."""
        return f"gamma={self.param:g}" + ("" if self.code == DivergenceCode.GAMMA else " (original)")

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
