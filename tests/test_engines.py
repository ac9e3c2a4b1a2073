"""The engines: choice of engine, the compile cache, httpstan's gradients, and agreement
between httpstan, CmdStan and BridgeStan on the same program, data and point.

The CmdStan and BridgeStan tests run wherever those are installed and skip, saying
why, where they are not (this machine and CI have neither: no network to fetch them).
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import robust_stan as rs
from robust_stan.building.divergences import DivergenceCode
from robust_stan.engines import resolve_engine
from robust_stan.engines.bridgestan_oracle import bridgestan_available
from robust_stan.engines.cmdstan_engine import cmdstan_available
from robust_stan.engines.httpstan_engine import httpstan_available
from robust_stan.results.arviz_output import group_names

DIVERGENCES = [rs.KL(), rs.BetaD(0.4), rs.GammaD(0.3), rs.GammaD(0.3, form="original")]
IDS = ["KL", "beta", "gamma", "gamma-original"]

needs_cmdstan = pytest.mark.skipif(
    not cmdstan_available(),
    reason="CmdStan is not installed (cmdstanpy.cmdstan_path() finds none); install it on a connected "
           "machine with `python -m cmdstanpy.install_cmdstan` to run the engine-agreement tests")
needs_bridgestan = pytest.mark.skipif(
    not bridgestan_available(),
    reason="no BridgeStan source tree (set BRIDGESTAN, or `pip install bridgestan` on a connected machine "
           "and let it fetch its sources) to run the BridgeStan oracle tests")
needs_httpstan = pytest.mark.skipif(not httpstan_available(), reason="httpstan is not installed")


def glm_data(n=15, p=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = 1.0 + X @ np.array([1.0, -0.5]) + rng.normal(size=n)
    y[:2] += 10
    return {"X": X, "y": y}


# -- choosing an engine ---------------------------------------------------------------------

def test_auto_prefers_cmdstan_and_falls_back_to_httpstan(monkeypatch):
    from robust_stan import engines

    monkeypatch.delenv("ROBUST_STAN_ENGINE", raising=False)
    monkeypatch.setattr(engines, "cmdstan_available", lambda: True)
    assert resolve_engine("auto") == "cmdstan"
    monkeypatch.setattr(engines, "cmdstan_available", lambda: False)
    monkeypatch.setattr(engines, "httpstan_available", lambda: True)
    assert resolve_engine("auto") == "httpstan"
    monkeypatch.setattr(engines, "httpstan_available", lambda: False)
    with pytest.raises(RuntimeError, match="no Stan engine"):
        resolve_engine("auto")


def test_environment_variable_overrides_auto(monkeypatch):
    monkeypatch.setenv("ROBUST_STAN_ENGINE", "httpstan")
    assert resolve_engine("auto") == "httpstan"
    assert rs.glm("normal").engine == "httpstan"
    monkeypatch.setenv("ROBUST_STAN_ENGINE", "nonsense")
    with pytest.raises(rs.RobustStanInputError, match="engine: unknown engine 'nonsense'"):
        resolve_engine("auto")


@pytest.mark.skipif(cmdstan_available(), reason="CmdStan is installed here")
def test_asking_for_missing_cmdstan_says_how_to_install_it():
    with pytest.raises(RuntimeError, match="install_cmdstan"):
        resolve_engine("cmdstan")


# -- the compile cache -------------------------------------------------------------------------

@pytest.mark.stan
@needs_httpstan
def test_second_process_reuses_the_compiled_program(glm_normal):
    """The session fixture compiled (or loaded) the normal glm; a new process must not build it."""
    script = textwrap.dedent("""
        import robust_stan as rs
        from robust_stan.engines import COMPILE_COUNTS
        rs.glm("normal", standardize=False, engine="httpstan").compile(show_progress=False)
        print("builds", COMPILE_COUNTS["httpstan"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "builds 0" in done.stdout



@pytest.mark.stan
@needs_httpstan
def test_httpstan_sampling_inside_process_pool_workers(glm_normal):
    """Each pool worker gets its own httpstan chain pool (the parent's pipes, inherited by fork,
    mixed up the chains' results) and that pool does not keep the worker from exiting (it hung)."""
    script = textwrap.dedent("""
        from concurrent.futures import ProcessPoolExecutor
        import numpy as np
        import robust_stan as rs

        def model():
            return rs.glm("normal", standardize=False, engine="httpstan")

        def fit_once(seed):
            rng = np.random.default_rng(seed)
            X = rng.normal(size=(20, 2))
            fit = model().sample({"X": X, "y": X @ [1.0, -1.0] + rng.normal(size=20)}, chains=2,
                               iter_warmup=100, iter_sampling=100, seed=seed, show_progress=False)
            return fit.draws("b").shape

        if __name__ == "__main__":
            model().compile(show_progress=False)  # imports httpstan, and its pool, before the fork
            with ProcessPoolExecutor(max_workers=2) as pool:
                print("shapes", list(pool.map(fit_once, [1, 2, 3, 4])))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "shapes [(2, 100, 2), (2, 100, 2), (2, 100, 2), (2, 100, 2)]" in done.stdout


# -- httpstan's gradient is the derivative of its log density -----------------------------------


@pytest.mark.stan
@needs_httpstan
def test_nuts_on_one_program_leaves_another_programs_functions_alone(glm_normal):
    """httpstan names every model's module "stan_services" and re-imports a model before NUTS;
    CPython copies the re-imported functions into sys.modules["stan_services"]. That was the
    last program we loaded (here the bernoulli glm), which then ran the normal glm's code
    (it failed the suite in an order where a NUTS run came between two programs' uses)."""
    script = textwrap.dedent("""
        import numpy as np
        import robust_stan as rs

        rng = np.random.default_rng(0)
        X = rng.normal(size=(20, 2))
        normal = rs.glm("normal", standardize=False, engine="httpstan")
        normal.compile(show_progress=False)
        bernoulli = rs.glm("bernoulli", standardize=False, engine="httpstan")
        bernoulli.compile(show_progress=False)
        data = {"X": X, "y": (X[:, 0] > 0).astype(int)}
        theta = np.full(bernoulli.unconstrained_dimension(data), 0.3)
        before = bernoulli.log_density(data, theta)
        normal.sample({"X": X, "y": X @ [1.0, -1.0]}, chains=1, iter_warmup=20, iter_sampling=20,
                      seed=1, show_progress=False)
        print("same", bernoulli.log_density(data, theta) == before)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "same True" in done.stdout


@pytest.mark.stan
@needs_httpstan
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_c_interface_gives_httpstans_own_log_density_and_gradient(glm_normal, divergence):
    """The model built once behind robust-stan's C interface against httpstan's own log_prob and
    log_prob_grad (which rebuild the model on every call): the same Stan code on the same
    doubles, through two autodiff entry points, so agreement to rounding (1e-12 relative)."""
    import httpstan.utils

    from robust_stan.engines.httpstan_engine import _as_httpstan_data
    from robust_stan.engines.native_model import split_data

    program = glm_normal.compile()
    data = glm_normal.stan_data(glm_data(n=40), divergence)
    ours, httpstans = split_data(_as_httpstan_data(data)), httpstan.utils._split_data(data)
    assert [name.encode() for name in ours[0]] == httpstans[0] and list(ours[2]) == list(httpstans[2])
    assert [name.encode() for name in ours[3]] == httpstans[3] and list(ours[5]) == list(httpstans[5])
    assert ours[1].tolist() == [float(v) for v in httpstans[1]] and ours[4].tolist() == [int(v) for v in httpstans[4]]
    native = program.native_model(data)
    assert native.dimension == 4
    for theta in points(4):
        for jacobian in (True, False):
            value, grad = native.log_density_gradient(theta, jacobian)
            assert value == pytest.approx(program.module.log_prob(data, list(theta), jacobian), rel=1e-12)
            np.testing.assert_allclose(grad, program.module.log_prob_grad(data, list(theta), jacobian),
                                       rtol=1e-12, atol=1e-12)
            assert native.log_density_gradient(theta, jacobian, gradient=False) == (value, None)
        # constrained values: the parameters and the deterministic generated quantities as
        # httpstan's own write_array gives them; y_rep from the seed given
        ours, httpstans = native.write_array(theta, True, True, seed=7), program.module.write_array(
            data, list(theta), True, True)
        n_rows = 40
        deterministic = slice(0, len(ours) - n_rows)  # y_rep comes last
        np.testing.assert_allclose(ours[deterministic], httpstans[deterministic], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(native.write_array(theta, True, True, seed=7), ours)
        assert not np.array_equal(native.write_array(theta, True, True, seed=8)[-n_rows:], ours[-n_rows:])
        assert native.write_array(theta, True, False).size == 4


@pytest.mark.stan
@needs_httpstan
def test_c_interface_reports_bad_data_and_bad_points(glm_normal):
    program = glm_normal.compile()
    data = glm_normal.stan_data(glm_data(n=40), rs.KL())
    with pytest.raises(ValueError, match="Stan rejected the data: .*learning_rate"):
        program.native_model(dict(data, learning_rate=-1.0))  # declared <lower=0> in the program
    native = program.native_model(data)
    with pytest.raises(ValueError, match="theta: expected 4"):
        native.log_density_gradient(np.zeros(3))
    with pytest.raises(ValueError, match="Scale parameter"):  # sigma = exp(-800) = 0: Stan's domain error
        native.log_density_gradient(np.array([0.0, 0.0, 0.0, -800.0]))


@pytest.mark.stan
@needs_httpstan
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_httpstan_gradient_matches_finite_differences(glm_normal, divergence):
    """Central differences, h = 1e-5: error O(h^2) ~ 1e-10 times third derivatives of order
    one, plus rounding ~1e-16 |lp| / h ~ 1e-10; 1e-6 leaves a wide margin."""
    data = glm_data()
    theta = np.array([0.3, 0.8, -0.2, 0.1])
    lp, grad = glm_normal.log_density_gradient(data, theta, divergence=divergence)
    assert lp == pytest.approx(glm_normal.log_density(data, theta, divergence=divergence), rel=1e-14)
    h = 1e-5
    fd = [(glm_normal.log_density(data, theta + h * e, divergence=divergence)
           - glm_normal.log_density(data, theta - h * e, divergence=divergence)) / (2 * h) for e in np.eye(4)]
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6)


# -- two engines, one program ---------------------------------------------------------------------

def points(dim, count=3, seed=2):
    return np.random.default_rng(seed).normal(scale=0.7, size=(count, dim))


@pytest.mark.stan
@needs_cmdstan
@needs_httpstan
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_cmdstan_and_httpstan_log_densities_and_gradients_agree(divergence):
    data = glm_data()
    via_cmdstan = rs.glm("normal", engine="cmdstan")
    via_httpstan = rs.glm("normal", engine="httpstan")
    assert via_cmdstan.stan_code == via_httpstan.stan_code
    for theta in points(4):
        for jacobian in (True, False):
            lp_c, g_c = via_cmdstan.log_density_gradient(data, theta, divergence=divergence, jacobian=jacobian)
            lp_h, g_h = via_httpstan.log_density_gradient(data, theta, divergence=divergence, jacobian=jacobian)
            assert lp_c == pytest.approx(lp_h, rel=1e-8)
            np.testing.assert_allclose(g_c, g_h, rtol=1e-8, atol=1e-10)
    if divergence.code != DivergenceCode.GAMMA_ORIGINAL:
        theta = points(4, 1)[0]
        np.testing.assert_allclose(via_cmdstan.per_example_gradients(data, theta, divergence),
                                   via_httpstan.per_example_gradients(data, theta, divergence), rtol=1e-8, atol=1e-10)


@pytest.mark.stan
@needs_cmdstan
def test_cmdstan_sampling_returns_the_same_kind_of_fit():
    data = glm_data(n=40)
    fit = rs.glm("normal", engine="cmdstan").sample(data, divergence=rs.BetaD(0.3), chains=2, iter_warmup=200,
                                                  iter_sampling=200, seed=1, show_progress=False)
    assert fit.draws("b").shape == (2, 200, 2)
    summary = fit.summary()
    assert {"mean", "sd", "5%", "95%", "ess_bulk", "ess_tail", "r_hat"} <= set(summary.columns)
    idata = fit.to_arviz()
    assert {"posterior", "sample_stats", "model_log_likelihood", "posterior_predictive",
            "observed_data"} <= set(group_names(idata))   # a beta fit: not ArviZ's log_likelihood
    assert fit.outlier_scores().shape == (40,)


@pytest.mark.stan
@needs_cmdstan
def test_cmdstan_generates_the_pointwise_quantities_on_demand_with_generate_quantities():
    """CmdStan's NUTS writes parameters only; log_lik then comes from CmdStan's standalone
    generated quantities and equals the normal log density at the reported draws."""
    data = glm_data(n=40)
    fit = rs.glm("normal", engine="cmdstan").sample(data, divergence=rs.BetaD(0.3), chains=2, iter_warmup=200,
                                                  iter_sampling=200, seed=1, show_progress=False)
    # a zero-size variable has no CSV column, so CmdStanPy has no such variable
    assert fit.raw.variables.get("log_lik", np.empty(0)).size == 0 and fit._pointwise is None
    mu = fit.draws("alpha")[..., None] + np.einsum("cdp,np->cdn", fit.draws("b"), data["X"])
    expected = -0.5 * np.log(2 * np.pi) - np.log(fit.draws("sigma")[..., None]) \
        - 0.5 * ((data["y"] - mu) / fit.draws("sigma")[..., None]) ** 2
    np.testing.assert_allclose(fit.log_lik, expected, rtol=1e-12, atol=1e-12)  # written with 18 significant digits
    np.testing.assert_array_equal(fit.y_rep, type(fit)(fit.model, fit.raw, fit.model.prepare(data, fit.divergence),
                                                       fit.settings).y_rep)  # seeded: the same on a second call


@pytest.mark.stan
@needs_bridgestan
@needs_httpstan
@pytest.mark.parametrize("divergence", DIVERGENCES, ids=IDS)
def test_bridgestan_and_httpstan_agree(glm_normal, divergence):
    from robust_stan.engines.bridgestan_oracle import bridgestan_model

    data = glm_data()
    stan_data = glm_normal.stan_data(data, divergence=divergence)
    oracle = bridgestan_model(glm_normal.stan_code, stan_data)
    program = glm_normal.compile()
    for theta in points(4):
        lp_b, g_b = oracle.log_density_gradient(theta)
        lp_h, g_h = program.log_density_gradient(stan_data, theta)
        assert lp_b == pytest.approx(lp_h, rel=1e-8)
        np.testing.assert_allclose(g_b, g_h, rtol=1e-8, atol=1e-10)
        drawn_b, drawn_h = oracle.constrain(theta), program.constrain(stan_data, theta)
        for name in ("alpha_copies", "b_copies", "sigma_copies", "log_lik"):
            np.testing.assert_allclose(drawn_b[name], drawn_h[name], rtol=1e-12)


#: How GCC and clang say that a header ({} in the pattern) does not exist.
MISSING_HEADER = r"{}(: No such file or directory|' file not found)"


@pytest.mark.stan
@needs_httpstan
def test_failed_cpp_build_shows_the_compilers_own_message(monkeypatch):
    """A build that the compiler (GCC or clang) refuses raises StanCompileError carrying its message, and leaves no
    half-built module in httpstan's cache. The failure is made real and quick: a CPPFLAGS
    (which setuptools passes to every compile) that includes a header that does not exist."""
    import uuid

    import httpstan.cache
    import httpstan.models

    from robust_stan.engines import compile_program
    from robust_stan.engines.httpstan_engine import _with_interface_mark

    monkeypatch.setenv("CPPFLAGS", "-include /nonexistent/robust_stan_missing_header.hpp")
    code = f"parameters {{ real x; }}\nmodel {{ x ~ normal(0, 1); }}\n// {uuid.uuid4().hex}\n"
    with pytest.raises(rs.StanCompileError) as error:
        compile_program(code, "httpstan", show_progress=False)
    message = str(error.value)
    assert "C++ compiler could not build" in message
    assert re.search(MISSING_HEADER.format(re.escape("robust_stan_missing_header.hpp")), message), message
    model_name = httpstan.models.calculate_model_name(_with_interface_mark(code))
    assert not httpstan.cache.model_directory(model_name).exists()


@pytest.mark.stan
@needs_httpstan
def test_extra_compiler_flags_reach_the_compiler_and_name_the_build(monkeypatch):
    """ROBUST_STAN_CXXFLAGS reaches the compiler's command line (shown by a flag that makes the build fail: an
    -include of a header that does not exist), and its flags are part of the program text httpstan
    names the build by, so builds with other flags are not reused. (That they come after httpstan's
    own -O3, so that -O1 takes effect, shows in the build times: docs/guide/engines.md.)"""
    import uuid

    from robust_stan.engines import compile_program
    from robust_stan.engines.httpstan_engine import _with_interface_mark

    code = f"parameters {{ real x; }}\nmodel {{ x ~ normal(0, 1); }}\n// {uuid.uuid4().hex}\n"
    monkeypatch.setenv("ROBUST_STAN_CXXFLAGS", "")
    unflagged = _with_interface_mark(code)
    monkeypatch.setenv("ROBUST_STAN_CXXFLAGS", "-O1 -include '/nonexistent/robust stan flag check.hpp'")
    flagged = _with_interface_mark(code)
    assert unflagged != flagged and "and the compiler flags -O1 -include '/nonexistent/robust stan" in flagged
    with pytest.raises(rs.StanCompileError, match=MISSING_HEADER.format("robust stan flag check.hpp")):
        compile_program(code, "httpstan", show_progress=False)
    monkeypatch.setenv("ROBUST_STAN_CXXFLAGS", "-O1 '-include")
    with pytest.raises(rs.StanCompileError, match="^ROBUST_STAN_CXXFLAGS: cannot split"):
        compile_program(code, "httpstan", show_progress=False)


@pytest.mark.stan
@pytest.mark.statistical_study  # a check that needs builds of its own (-O3, and its precompiled header)
@needs_httpstan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")  # 200 draws of one chain: no R-hat
def test_a_build_at_o1_computes_what_httpstans_o3_build_computes(monkeypatch):
    """The suite builds at -O1 (tests/conftest.py); users get httpstan's -O3. GCC and clang keep IEEE arithmetic
    at every level (no -ffast-math), so both builds of the normal glm (its beta and gamma losses in native C++)
    give the same log densities and gradients to the last bit under KL, beta and gamma, and NUTS the same
    draws for the same seed."""
    data = {"X": np.linspace(-2, 2, 30)[:, None], "y": np.sin(np.arange(30.0))}
    data["y"][:3] += 8
    fits, values, builds = [], [], set()
    for flags in ("-O1", ""):
        monkeypatch.setenv("ROBUST_STAN_CXXFLAGS", flags)
        model = rs.glm("normal", engine="httpstan")
        builds.add(model.compile(show_progress=False).model_name)
        theta = np.random.default_rng(4).normal(size=(3, model.dimension(model.stan_data(data))))
        values.append([model.log_density_gradient(data, t, divergence=d) for t in theta
                       for d in (rs.KL(), rs.BetaD(0.5), rs.GammaD(0.3))])
        fits.append(model.sample(data, divergence=rs.BetaD(0.5), chains=1, iter_warmup=200, iter_sampling=200,
                                 seed=6, show_progress=False).draws("b"))
    assert len(builds) == 2
    assert values[0] and all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(*values))
    np.testing.assert_array_equal(fits[0], fits[1])


@pytest.mark.stan
@needs_httpstan
def test_stanc_error_on_the_httpstan_path_names_the_line():
    from robust_stan.engines import compile_program

    with pytest.raises(rs.StanCompileError, match=r"(?s)stanc .*cannot compile.*line 2"):
        compile_program("parameters { real x; }\nmodel { x ~ normal(0, ; }\n", "httpstan", show_progress=False)


def test_the_build_child_imports_only_the_modules_a_build_needs():
    """The child process that builds a program skips the package's ``__init__`` modules (which import the
    whole library) and imports none of pandas, ArviZ or robust-stan's api layer, yet has the build's entry."""
    from robust_stan.engines.httpstan_build import CHILD_IMPORTS

    report = "print(callable(main), sorted(m for m in ('pandas', 'arviz', 'robust_stan.api') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", CHILD_IMPORTS + report, str(Path(rs.__file__).parent)],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "[]"], done.stdout + done.stderr


def test_version_of_python_a_pybind11_object_was_built_for(tmp_path):
    """The "3.N" literal nearest pybind11's version-check message; None without that message."""
    from robust_stan.engines.httpstan_build import built_for_python

    obj = tmp_path / "stan_services.o"
    obj.write_bytes(b"\x00" * 50 + b"\x003.2\x00" + b"x" * 5000 + b"module was compiled for Python %s\x00"
                    + b"y" * 100 + b"\x003.10\x00" + b"z" * 100)
    assert built_for_python(obj) == "3.10"
    obj.write_bytes(b"\x003.12\x00 nothing else")
    assert built_for_python(obj) is None


@pytest.mark.stan
@needs_httpstan
def test_installed_httpstans_object_is_read_and_models_load_on_this_python(glm_normal):
    """The shipped object's Python version is read; whatever it is, the compiled model loads here
    (on httpstan 4.17.0 for CPython 3.13 the shipped object is for 3.10 and is replaced)."""
    import httpstan

    from robust_stan.engines.httpstan_build import built_for_python

    shipped = built_for_python(Path(httpstan.__file__).with_name("stan_services.o"))
    assert shipped is None or re.fullmatch(r"3\.\d+", shipped)
    program = glm_normal.compile()
    assert f".cpython-{sys.version_info.major}{sys.version_info.minor}-" in Path(program.module.__file__).name
    assert program.native_model(glm_normal.stan_data(glm_data(n=10), rs.KL())).dimension == 4


@pytest.mark.stan
@needs_httpstan
def test_the_compiler_output_kept_with_a_build_has_no_ignored_attributes_warnings(glm_normal):
    """Eigen's ignored-attributes warnings are not asked for (httpstan_build.MODEL_COMPILER_FLAGS, part of the
    build's name): under Python's -Wall each model drew hundreds of them into the output httpstan keeps."""
    import httpstan.cache

    output = httpstan.cache.load_services_extension_module_compiler_output(glm_normal.compile().model_name)
    assert "-Wignored-attributes" not in output


@pytest.mark.stan
@needs_httpstan
def test_a_build_with_gcc_or_clang_has_a_precompiled_header_for_its_compiler_and_flags():
    """A new program's build with GCC or clang (the compiler setuptools uses: CXX in .ci/run) makes or finds
    the precompiled header of Stan's headers for its own compiler and flags, and no such header failed to be
    made (a failure would leave the builds slower, not wrong)."""
    import json
    import uuid

    import httpstan.cache

    from robust_stan.engines import compile_program
    from robust_stan.engines.httpstan_build import (
        PRECOMPILED,
        _compiler_command,
        compiler_family,
        extra_compiler_flags,
    )

    command = _compiler_command()
    family = compiler_family(command)
    if family is None:
        pytest.skip(f"{command[0]} is neither GCC nor clang: models build without a precompiled header")
    compile_program(f"parameters {{ real x; }}\nmodel {{ x ~ normal(0, 1); }}\n// {uuid.uuid4().hex}\n", "httpstan",
                    show_progress=False)
    flags = extra_compiler_flags()  # the last flags of a model's compilation (-O1 in the suite)

    def for_this_build(folder):  # done (others may be in the making), by this compiler with these flags
        if not (folder / "done").exists():
            return False
        arguments = json.loads((folder / "arguments.json").read_text())
        return arguments[:len(command)] == command and arguments[len(arguments) - len(flags):] == flags

    made = [folder for folder in (httpstan.cache.cache_directory() / "robust_stan_pch").iterdir() if for_this_build(folder)]
    assert made, "no precompiled header of Stan's headers for this compiler and these flags"
    for folder in made:
        assert not (folder / "failed.log").exists(), (folder / "failed.log").read_text()
        assert (folder / f"robust_stan_pch.hpp{PRECOMPILED[family].suffix}").stat().st_size > 0


def installed_compiler(compiler: str) -> str:
    """The command that runs ``compiler`` ("g++" or "clang++"): itself, or the versioned name CXX gives
    (.ci/run: clang++-16) when only that is installed; skips the test when neither is."""
    chosen = os.environ.get("CXX", "")
    command = compiler if shutil.which(compiler) else chosen if Path(chosen).name.startswith(compiler) else None
    if command is None or shutil.which(command) is None:
        pytest.skip(f"{compiler} is not installed")
    return command


@pytest.mark.parametrize("compiler", ["g++", "clang++"])
def test_the_debug_stripping_link_flags_leave_no_debug_information_in_a_module(tmp_path, compiler):
    """A shared object compiled with -g and linked with debug_stripping_link_flags by GCC and by clang
    (each where it is installed) has no .debug_info section; linked without them it has one. Off Linux
    (Apple's ld64 refuses --strip-debug) no flag is added."""
    from robust_stan.engines.httpstan_build import debug_stripping_link_flags

    assert debug_stripping_link_flags("darwin") == [] and debug_stripping_link_flags("linux") == ["-Wl,--strip-debug"]
    if not sys.platform.startswith("linux"):
        pytest.skip("the flags are tested by linking on Linux only")
    command = installed_compiler(compiler)
    source = tmp_path / "module.cpp"
    source.write_text("int answer() { return 42; }\n")

    def linked(flags: list[str]) -> bytes:
        module = tmp_path / f"module{len(flags)}.so"
        done = subprocess.run([command, "-g", "-fPIC", "-shared", str(source), "-o", str(module)] + flags,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return module.read_bytes()

    assert b".debug_info" in linked([])
    assert b".debug_info" not in linked(debug_stripping_link_flags())


@pytest.mark.parametrize("compiler", ["g++", "clang++"])
def test_precompiled_header_is_built_once_used_and_refused_cleanly(tmp_path, compiler, monkeypatch):
    """precompiled_header, with GCC and with clang (each where it is installed): built once per setting
    and used. GCC's ``-H`` marks a used .gch with '!'; clang's ``-include-pch`` has no fallback, so a
    source that compiles without its own includes used it. Other flags, or another compiler under the
    same name (an upgrade), get a header of their own; a header whose file has gone is not given. A
    header the compiler cannot compile gives None, keeps its message and is not tried again."""
    from robust_stan.engines import httpstan_build
    from robust_stan.engines.httpstan_build import (
        PRECOMPILED,
        _compiler_command,
        compiler_family,
        precompiled_header,
        using_precompiled_header,
    )

    flags = [flag for flag in _compiler_command()[1:] if flag.startswith("-")]  # Python's (not a wrapper's words)
    arguments = [installed_compiler(compiler)] + flags + ["-O1", "-std=c++14"]  # as a build's
    family = compiler_family(arguments)
    if sys.platform == "darwin" and compiler == "g++" and family == "clang":
        pytest.skip("g++ is Apple's clang here")
    assert family == {"g++": "gcc", "clang++": "clang"}[compiler]
    header = precompiled_header(tmp_path, arguments, ["<vector>", "<map>"], family)
    assert header is not None and Path(f"{header}{PRECOMPILED[family].suffix}").stat().st_size > 0
    assert precompiled_header(tmp_path, arguments, ["<vector>", "<map>"], family) == header  # the same setting: reused
    source = tmp_path / "use.cpp"
    source.write_text("int main() { std::vector<int> v(3); std::map<int, int> m; return int(v.size() + m.size()) - 3; }\n")
    used = subprocess.run(arguments + ["-H", "-fsyntax-only"] + using_precompiled_header(header, family) + [str(source)],
                          capture_output=True, text=True)
    assert used.returncode == 0, used.stderr
    if family == "gcc":
        assert f"! {header}.gch" in used.stderr.splitlines()
    assert precompiled_header(tmp_path, arguments + ["-O2"], ["<vector>"], family) not in (None, header)  # new flags
    identity = httpstan_build.compiler_identity(arguments[0])
    monkeypatch.setattr(httpstan_build, "compiler_identity", lambda command: identity + " (upgraded)")
    upgraded = precompiled_header(tmp_path, arguments, ["<vector>", "<map>"], family)
    assert upgraded not in (None, header)  # the same name and flags, another compiler: a header of its own
    Path(f"{upgraded}{PRECOMPILED[family].suffix}").unlink()
    assert precompiled_header(tmp_path, arguments, ["<vector>", "<map>"], family) is None  # its file has gone
    monkeypatch.undo()

    broken = tmp_path / "broken.hpp"
    broken.write_text("this is not C++;\n")
    assert precompiled_header(tmp_path, arguments, [f'"{broken}"'], family) is None
    (failed,) = tmp_path.glob("*/failed.log")
    assert "broken.hpp" in failed.read_text()
    assert precompiled_header(tmp_path, arguments, [f'"{broken}"'], family) is None


@pytest.mark.stan
@needs_httpstan
def test_engine_recovers_after_a_chains_process_died(glm_normal):
    """A chain process that dies breaks httpstan's process pool; the call that meets it says so,
    and the next call samples normally (it used to fail with "process pool is not usable")."""
    from concurrent.futures.process import BrokenProcessPool

    import httpstan.services_stub

    glm_normal.compile()
    dying = httpstan.services_stub.executor.submit(os._exit, 1)
    with pytest.raises(BrokenProcessPool):
        dying.result(timeout=120)
    data = glm_data(n=30)
    with pytest.raises(RuntimeError, match="has been restarted"):
        glm_normal.sample(data, chains=1, iter_warmup=50, iter_sampling=50, show_progress=False)
    fit = glm_normal.sample(data, chains=2, iter_warmup=100, iter_sampling=100, seed=3, show_progress=False)
    assert fit.draws("b").shape == (2, 100, 2) and np.all(np.isfinite(fit.draws("b")))


@pytest.mark.stan
@pytest.mark.skipif(not httpstan_available(), reason="httpstan is not installed")
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")  # 50 draws: too few for R-hat
def test_httpstan_nuts_runs_inside_a_running_event_loop():
    """As from a Jupyter cell, where an asyncio event loop is already running: httpstan's coroutines run
    on a worker thread's own loop (asyncio.run would refuse), and the chains' processes are forked from
    the calling thread (forked from the worker thread they crashed). The draws are those of the same
    call outside a loop."""
    import asyncio

    rng = np.random.default_rng(3)
    data = {"X": rng.normal(size=(30, 1)), "y": rng.normal(size=30)}
    model = rs.glm("normal", engine="httpstan")
    options = dict(chains=2, iter_warmup=100, iter_sampling=50, seed=4, show_progress=False)

    async def cell():
        return model.sample(data, **options)

    inside = asyncio.run(cell())
    outside = model.sample(data, **options)
    np.testing.assert_array_equal(inside.draws("alpha"), outside.draws("alpha"))
