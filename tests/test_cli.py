"""The command line: the demo writes its files; fit reads a CSV and prints a summary."""

import arviz as az
import numpy as np
import pandas as pd
import pytest

from robust_stan.cli import main
from robust_stan.results.arviz_output import group_names

from .conftest import ENGINE


@pytest.mark.stan
def test_demo_runs_and_writes_its_files(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), "--chains", "2", "--iter-warmup", "300",
                 "--iter-sampling", "300", "--quiet", "--engine", ENGINE])
    assert code == 0
    printed = capsys.readouterr().out
    assert "KL mean" in printed and "beta=0.3 mean" in printed and "b[1]" in printed
    for name in ("demo_posteriors.png", "demo_table.csv", "demo_kl.nc", "demo_beta.nc"):
        assert (out / name).stat().st_size > 0, name
    idata = az.from_netcdf(str(out / "demo_beta.nc"))
    assert {"posterior", "model_log_likelihood", "posterior_predictive", "observed_data"} <= set(group_names(idata))
    table = pd.read_csv(out / "demo_table.csv", index_col=0)
    assert list(table.index) == ["alpha", "b[1]", "b[2]", "b[3]"]


@pytest.mark.stan
def test_fit_reads_csv_and_prints_summary(tmp_path, capsys):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x1": rng.normal(size=60), "x2": rng.normal(size=60)})
    frame["target"] = 1 + 2 * frame["x1"] + rng.normal(size=60)
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    code = main(["fit", "--model", "glm", "--family", "normal", "--divergence", "beta", "--beta", "0.3",
                 str(path), "--y", "target", "--chains", "2", "--iter-warmup", "300", "--iter-sampling", "300",
                 "--quiet", "--engine", ENGINE])
    assert code == 0
    printed = capsys.readouterr().out
    assert "b[x1]" in printed and "r_hat" in printed


def test_fit_names_a_missing_column(tmp_path, capsys):
    path = tmp_path / "data.csv"
    pd.DataFrame({"a": [1.0, 2.0]}).to_csv(path, index=False)
    assert main(["fit", str(path), "--y", "nope", "--engine", ENGINE]) == 2
    assert "--y" in capsys.readouterr().err


@pytest.mark.parametrize("content,args,flag", [
    (None, ["--y", "a"], "csv: cannot read"),
    ({"a": [1.0, 2.0], "b": ["x", "y"]}, ["--y", "a"], "--x: columns ['b'] are not numeric"),
    ({"a": ["p", "q"], "b": [1.0, 2.0]}, ["--y", "a"], "--y: column 'a' is not numeric"),
])
def test_fit_names_bad_csv_input(tmp_path, capsys, content, args, flag):
    path = tmp_path / "data.csv"
    if content is not None:
        pd.DataFrame(content).to_csv(path, index=False)
    assert main(["fit", str(path), *args, "--engine", ENGINE]) == 2
    assert flag in capsys.readouterr().err
