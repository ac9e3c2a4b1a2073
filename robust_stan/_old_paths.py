"""The module paths of robust-stan 0.x (a flat package), kept importable for one release.

``import robust_stan.fit`` or ``from robust_stan.rob_ula import RobULAFit`` still
work, with a DeprecationWarning naming the new path; the names resolve in the
modules listed for each old path, in order. The public API (``import robust_stan
as rs; rs.glm(...)``) is unchanged and needs none of this.
"""

from __future__ import annotations

import copyreg
import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

OLD_PATHS = {
    "robust_stan.errors": ("robust_stan.common.errors",),
    "robust_stan.resources": ("robust_stan.common.resources",),
    "robust_stan.progress": ("robust_stan.common.progress",),
    "robust_stan.parallel": ("robust_stan.common.parallel",),
    "robust_stan.families": ("robust_stan.building.families",),
    "robust_stan.divergences": ("robust_stan.building.divergences",),
    "robust_stan.spec": ("robust_stan.building.spec",),
    "robust_stan.data": ("robust_stan.building.data",),
    "robust_stan.codegen": ("robust_stan.building.codegen",),
    "robust_stan.stanc": ("robust_stan.building.stanc",),
    "robust_stan.library": ("robust_stan.building.library",),
    "robust_stan.oracles": ("robust_stan.gradients.oracles",),
    "robust_stan.per_example": ("robust_stan.gradients.per_example",),
    "robust_stan.estimators": ("robust_stan.methods.rob_ula.estimators",),
    "robust_stan.variational": ("robust_stan.methods.variational.robust_vi", "robust_stan.results.method_fits"),
    "robust_stan.stan_methods": ("robust_stan.methods.stan_methods", "robust_stan.results.method_fits"),
    "robust_stan.rob_ula": ("robust_stan.api.rob_ula", "robust_stan.methods.rob_ula.sampler",
                            "robust_stan.results.method_fits"),
    "robust_stan.rob_ula_tuning": ("robust_stan.api.rob_ula_tuning",),
    "robust_stan.fit": ("robust_stan.results.fit",),
    "robust_stan.arviz_output": ("robust_stan.results.arviz_output",),
    "robust_stan.influence": ("robust_stan.api.influence", "robust_stan.methods.variational.influence",
                              "robust_stan.methods.held_out", "robust_stan.results.influence"),
    "robust_stan.model": ("robust_stan.api.model", "robust_stan.gradients.program", "robust_stan.building.data"),
    "robust_stan.builtin": ("robust_stan.api.builtin",),
    "robust_stan.neural_network": ("robust_stan.api.neural_network",),
}


def _importer_stacklevel() -> int:
    """warnings.warn's stacklevel that points at the user's import statement, past importlib's frames."""
    frame, level = sys._getframe(2), 2
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        frame, level = frame.f_back, level + 1
    return level


class _OldPathLoader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths and gives each a module that forwards its names to the new modules."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in OLD_PATHS else None

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        new_paths = OLD_PATHS[module.__name__]
        warnings.warn(f"{module.__name__} is now {new_paths[0]}; the old module path will be removed in the next "
                      "release (the public API, robust_stan.*, is unchanged)", DeprecationWarning,
                      stacklevel=_importer_stacklevel())
        targets = [importlib.import_module(name) for name in new_paths]

        def __getattr__(name):
            for target in targets:
                if hasattr(target, name):
                    return getattr(target, name)
            raise AttributeError(f"module {module.__name__!r} (now {new_paths[0]}) has no attribute {name!r}")

        module.__getattr__ = __getattr__
        module.__dir__ = lambda: sorted({n for t in targets for n in dir(t)})


class _PublicNamespace(types.ModuleType):
    """The type of the ``robust_stan`` module: Python binds a newly imported submodule to its
    parent's attribute of the same name, so without this ``import robust_stan.rob_ula`` would
    replace the function ``rs.rob_ula`` (and ``rs.influence``) by the old path's module."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and value.__name__ in OLD_PATHS and name in self.__dict__:
            return
        super().__setattr__(name, value)


def _import_by_name(module: _PublicNamespace):
    return importlib.import_module, (module.__name__,)


sys.modules[__name__.rpartition(".")[0]].__class__ = _PublicNamespace
# pickles (cloudpickle's too, for functions sent to Dask workers) know a module by exact type,
# so tell them that this one is imported by name as well
copyreg.pickle(_PublicNamespace, _import_by_name)
if not any(isinstance(finder, _OldPathLoader) for finder in sys.meta_path):
    sys.meta_path.append(_OldPathLoader())
