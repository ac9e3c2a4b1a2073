"""The two kinds of model the methods take, and the check that the user passed one."""

from __future__ import annotations

from typing import TypeAlias

from ..common.errors import RobustStanInputError
from .model import Model
from .stan_program import StanProgramModel

#: A built-in model (rs.glm, rs.location, rs.custom) or your own program (rs.from_stan, rs.robustify).
AnyModel: TypeAlias = Model | StanProgramModel


def require_model(model, method: str, argument: str = "model") -> AnyModel:
    """``model``, once it is known to be a robust-stan model; an error naming it otherwise.

    Parameters
    ----------
    model : object
        What the user passed as the model.
    method : str
        The public call, for the message.
    argument : str, default "model"
        The argument's name, for the message.

    Returns
    -------
    Model or StanProgramModel
        ``model``.

    Raises
    ------
    RobustStanInputError
        If ``model`` is neither.
    """
    if not isinstance(model, (Model, StanProgramModel)):
        raise RobustStanInputError(f"{argument}: {method} needs a robust_stan model (rs.glm, rs.location, rs.custom, "
                                   f"rs.from_stan or rs.robustify), got {type(model).__name__}")
    return model
