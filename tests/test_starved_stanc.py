"""Translating a program does not depend on timing: stanc runs with no time limit, so a compile in
a low-priority process on busy cores (niced fits on a shared server, many fits on Dask workers)
succeeds. httpstan's own ``compile()`` gives stanc one second and is never used."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("httpstan")

from robust_stan.engines.httpstan_build import translate

PROGRAM = """
data { int<lower=0> J; array[J] real y; array[J] real<lower=0> sigma; }
parameters { real mu; real<lower=0> tau; vector[J] theta_tilde; }
transformed parameters { vector[J] theta = mu + tau * theta_tilde; }
model {
  mu ~ normal(0, 5); tau ~ cauchy(0, 5); theta_tilde ~ normal(0, 1);
  y ~ normal(theta, sigma);
}
generated quantities { array[J] real y_rep = normal_rng(theta, sigma); }
"""

CHILD = """
import sys
from robust_stan.engines.httpstan_build import translate
print("ready", flush=True)
sys.stdin.readline()
cpp, _ = translate(sys.argv[1], "model_starved")
print("translated", "model_starved" in cpp, flush=True)
"""


def test_translation_never_uses_httpstans_one_second_stanc(monkeypatch):
    import httpstan.compile

    def refuse(*args, **kwargs):
        raise AssertionError("httpstan.compile.compile runs stanc with timeout=1")

    monkeypatch.setattr(httpstan.compile, "compile", refuse)
    cpp, _ = translate(PROGRAM, "model_eight_schools")
    assert "model_eight_schools" in cpp


def test_a_starved_process_translates(tmp_path):
    """A ``nice -n 19`` process translates while as many busy processes as cores run at a
    higher priority (nice 5). The child imports first and says when it is ready, so only stanc runs starved
    (every stanc call robust-stan makes goes through the same stanc_process)."""
    child = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", CHILD, PROGRAM], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy = []
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        # one busy process per core, niced 5 so that the starving stays short; httpstan's compile()
        # times out (1 s) under it
        busy = [subprocess.Popen(["nice", "-n", "5", sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 1)]
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=600)
    finally:
        for process in busy:
            process.kill()
            process.wait()
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert out.strip() == "translated True"
