"""The public entry points check and convert their arguments once, and pass typed objects down;
the 0.x module paths still import, with a DeprecationWarning."""

import importlib
import subprocess
import sys
import warnings

import pytest

import robust_stan as rs
from robust_stan.building import data as data_module, divergences as divergences_module

from .conftest import regression_data


@pytest.fixture
def conversions(monkeypatch):
    """Counts of prepare_data and as_divergence calls, wherever in the package they are made from."""
    counts = {"prepare_data": 0, "as_divergence": 0}
    originals = {"prepare_data": data_module.prepare_data, "as_divergence": divergences_module.as_divergence}

    def counted(name):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return originals[name](*args, **kwargs)
        return wrapper

    for module in [m for n, m in sys.modules.items() if n.startswith("robust_stan.")]:
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counted(name))
    return counts


ENTRY_POINTS = {
    "sample": lambda model, data: model.sample(data, rs.BetaD(0.3), chains=2, iter_warmup=20, iter_sampling=20,
                                               seed=1, show_progress=False),
    "variational": lambda model, data: model.variational(data, rs.BetaD(0.3), iter=20, eval_elbo=10, draws=5,
                                                         seed=1, show_progress=False),
    "rob_ula": lambda model, data: rs.rob_ula(model, data, epsilon=0.1, divergence=rs.BetaD(0.3), iters=20,
                                              warmup=0, chains=2, seed=1, show_progress=False),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_public_call_converts_the_divergence_and_prepares_the_data_once(glm_normal, conversions, entry):
    data, _, _, _ = regression_data(n=40, p=2, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 20 draws do not converge; only the counts matter here
        ENTRY_POINTS[entry](glm_normal, data)
    assert conversions == {"prepare_data": 1, "as_divergence": 1}


@pytest.mark.parametrize("old, new, name", [
    ("robust_stan.fit", "robust_stan.results.fit", "Fit"),
    ("robust_stan.rob_ula", "robust_stan.results.method_fits", "RobULAFit"),
    ("robust_stan.rob_ula", "robust_stan.methods.rob_ula.sampler", "default_estimator"),
    ("robust_stan.variational", "robust_stan.results.method_fits", "VariationalFit"),
    ("robust_stan.estimators", "robust_stan.methods.rob_ula.estimators", "lrv_once"),
    ("robust_stan.data", "robust_stan.building.data", "prepare_data"),
    ("robust_stan.model", "robust_stan.api.model", "Model"),
])
def test_an_old_module_path_warns_and_gives_the_same_object(old, new, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"^{old} is now robust_stan\."):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name  # noqa: B018


def test_importing_an_old_path_leaves_the_public_function_of_that_name():
    for old in ("robust_stan.rob_ula", "robust_stan.influence"):
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning):
            importlib.import_module(old)
    assert rs.rob_ula.__module__ == "robust_stan.api.rob_ula"
    assert rs.influence.__module__ == "robust_stan.api.influence"


def test_the_public_namespace_loads_no_old_path():
    """`import robust_stan` and every rs. name work with DeprecationWarnings as errors, and load none
    of the old module paths."""
    code = ("import sys, robust_stan as rs; [getattr(rs, n) for n in rs.__all__]; "
            "from robust_stan._old_paths import OLD_PATHS; print(sorted(set(OLD_PATHS) & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
