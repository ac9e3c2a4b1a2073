"""A model's generated Stan program: compiled once, its unconstrained layout, its gradient oracles.

Everything here takes Stan data that :func:`robust_stan.building.data.prepare_data`
has already checked; the public :class:`robust_stan.Model` adds the entry points
that take the user's data.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..building.codegen import render_program
from ..building.data import Scaling, to_fitted_scale, to_original_scale, with_switches
from ..building.spec import ModelSpec, ParameterDeclaration
from ..common.errors import require_inits
from ..engines import ProgramSource
from .oracles import GradientOracle, make_oracle

# Number of trailing dimensions that belong to one element of each base type.
_ELEMENT_NDIM = {"real": 0, "row_vector": 1, "matrix": 2, "column_stochastic_matrix": 2,
                 "row_stochastic_matrix": 2, "cholesky_factor_corr": 2, "corr_matrix": 2,
                 "cov_matrix": 2, "cholesky_factor_cov": 2}


def _unconstrained_element_size(base: str, dims: tuple[int, ...]) -> int:
    """Size of one element of a parameter type on Stan's unconstrained scale."""
    if base in ("simplex", "sum_to_zero_vector"):
        return dims[0] - 1
    if base in ("cholesky_factor_corr", "corr_matrix"):
        return dims[0] * (dims[0] - 1) // 2
    if base == "cov_matrix":
        return dims[0] + dims[0] * (dims[0] - 1) // 2
    if base == "cholesky_factor_cov":
        m, n = dims
        return n * (n + 1) // 2 + (m - n) * n
    if base == "column_stochastic_matrix":
        return (dims[0] - 1) * dims[1]
    if base == "row_stochastic_matrix":
        return dims[0] * (dims[1] - 1)
    return int(np.prod(dims)) if dims else 1


class GeneratedProgram(ProgramSource):
    """The generated program of a :class:`~robust_stan.building.spec.ModelSpec` on one engine.

    ``stan_code`` is the readable program; it compiles on first use and every
    later call (and later process) reuses the build. The divergence, learning
    rate, weights and mode are data, so one compiled program serves every method.
    """

    def __init__(self, spec: ModelSpec, engine: str = "auto", kind: str = "custom"):
        super().__init__(render_program(spec), engine)
        self.spec = spec
        self.kind = kind
        if kind == "custom":
            from ..building.stanc import check_program

            check_program(self.stan_code, spec)

    # -- the unconstrained parameters ---------------------------------------------
    def parameter_layout(self, stan_data: dict) -> list[tuple[ParameterDeclaration, int, int]]:
        """How each parameter sits in the unconstrained vector.

        Parameters
        ----------
        stan_data : dict
            The Stan data, which fix the number of copies.

        Returns
        -------
        list of tuple
            (declaration, copies, unconstrained size of one copy) per parameter.
        """
        dims = self.compile().variable_shapes(stan_data)
        layout = []
        for p in self.spec.parameters:
            shape = dims[f"{p.name}_copies"]
            ndim = 0 if p.base == "real" else _ELEMENT_NDIM.get(p.base, 1)
            element = shape[len(shape) - ndim:] if ndim else ()
            per_copy_elements = int(np.prod(shape[1:len(shape) - ndim])) if len(shape) - ndim > 1 else 1
            layout.append((p, shape[0], per_copy_elements * _unconstrained_element_size(p.base, tuple(element))))
        return layout

    def dimension(self, stan_data: dict) -> int:
        """Number of unconstrained parameters of the program for these Stan data.

        Parameters
        ----------
        stan_data : dict
            Stan data.

        Returns
        -------
        int
            The dimension d.
        """
        return sum(copies * size for _, copies, size in self.parameter_layout(stan_data))

    def oracle_for(self, stan_data: dict, oracle: str = "auto") -> GradientOracle:
        """A gradient oracle for already prepared Stan data.

        Parameters
        ----------
        stan_data : dict
            Stan data.
        oracle : {"auto", "bridgestan", "httpstan"}, default "auto"
            The engine of the log density and gradients.

        Returns
        -------
        GradientOracle
            Log density and gradient at unconstrained points.
        """
        return make_oracle(self.stan_code, stan_data, self.dimension(stan_data), oracle)

    def require_rows(self, argument: str, purpose: str) -> None:
        """Nothing: a built-in model's data can be taken apart by rows (cut, held out, replaced).

        Parameters
        ----------
        argument : str
            The argument that asks for it.
        purpose : str
            What needs the rows.
        """

    # -- starting points ------------------------------------------------------------
    def chain_inits(self, inits, chains: int, scaling: Scaling) -> list[dict] | None:
        """Starting values by parameter name as the program's ``*_copies`` variables on the fitted scale.

        Parameters
        ----------
        inits : dict, list of dict or None
            Constrained values by parameter name, one dict for all chains or one per chain; None
            stays None.
        chains : int
            Number of chains.
        scaling : Scaling
            How the outcome was standardised.

        Returns
        -------
        list of dict or None
            One dict per chain.

        Raises
        ------
        RobustStanInputError
            If a value or a name does not fit the model's parameters.
        """
        checked = require_inits(inits, chains, self.spec.parameter_names)
        if checked is None:
            return None
        return [{f"{k}_copies": np.asarray([to_fitted_scale(self.spec.rescale.get(k), v, scaling)])
                 for k, v in init.items()} for init in checked]

    def unconstrain_init(self, init: Mapping, stan_data: dict, scaling: Scaling) -> np.ndarray:
        """A dict of every parameter's value (original scale) as an unconstrained vector.

        Parameters
        ----------
        init : mapping
            Every parameter's value by name.
        stan_data : dict
            Stan data.
        scaling : Scaling
            The outcome's standardisation, to move values to the fitted scale.

        Returns
        -------
        numpy.ndarray
            The unconstrained point.

        Raises
        ------
        RobustStanInputError
            If a parameter is missing.
        """
        require_inits(init, 1, self.spec.parameter_names, every=True)
        inits = self.chain_inits(init, 1, scaling)
        assert inits is not None  # init is a dict here
        values = inits[0]
        return self.oracle_for(stan_data).unconstrain(values)

    def inits_at(self, thetas, stan_data: dict, scaling: Scaling, oracle: GradientOracle | None = None) -> list[dict]:
        """The inverse of :meth:`unconstrain_init`, for several points.

        Parameters
        ----------
        thetas : array_like
            Unconstrained points, one per row.
        stan_data, scaling
            As for :meth:`unconstrain_init`.
        oracle : GradientOracle or None, default None
            An oracle of these Stan data already built (without the per-observation output); None
            builds one.

        Returns
        -------
        list of dict
            Each point as every parameter's value by name on the outcome's own scale, as
            :meth:`chain_inits` takes them.
        """
        oracle = self.oracle_for(with_switches(stan_data, pointwise=False)) if oracle is None else oracle
        out = []
        for theta in thetas:
            values = oracle.constrain(theta, include_gqs=True, seed=0)  # the parameters on the fitted scale
            out.append({name: to_original_scale(self.spec.rescale.get(name), values[name], scaling)
                        for name in self.spec.parameter_names})
        return out
