"""Fits of Stan's own ADVI, Pathfinder and Laplace approximation (CmdStan engine)."""

from __future__ import annotations

from .mcmc import Fit


class StanMethodFit(Fit):
    """Draws from Stan's ADVI, Pathfinder or Laplace approximation, as a robust-stan fit.

    sample_stats hold CmdStan's own per-draw columns (``lp__``, ``log_p__``,
    ``log_g__``, ...); ``raw.backend`` is CmdStanPy's result object.

    Parameters
    ----------
    model : Model or StanProgramModel
        The model that was run.
    raw : RawDraws
        The engine-neutral output.
    prepared : PreparedData
        The data and settings the run used.
    settings : StanMethodSettings
        The run's settings (``settings.method`` names the algorithm).
    """

    @property
    def method(self) -> str:  # type: ignore[override]  # read from the settings, unlike Fit's class attribute
        """The algorithm: "advi", "pathfinder" or "laplace" (str)."""
        return self.settings.method

    def diagnostics(self) -> dict:
        """The algorithm and the number of draws.

        Returns
        -------
        dict
            The diagnostics by name.
        """
        return {"method": self.settings.method, "draws": self.settings.draws}

    def __repr__(self) -> str:
        return (f"<robust_stan.StanMethodFit {self.settings.method}, {self.divergence!r}, "
                f"{self.settings.draws} draws, parameters {self.parameter_names}>")
