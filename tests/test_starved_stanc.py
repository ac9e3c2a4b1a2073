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
import sys, time
from robust_stan.engines.httpstan_build import translate
translate(sys.argv[1], "model_warm")  # imports and first-call work done before the starving starts
print("ready", flush=True)
sys.stdin.readline()
start = time.monotonic()
cpp, _ = translate(sys.argv[1], "model_starved")
print("translated", "model_starved" in cpp, time.monotonic() - start, flush=True)
import os
os._exit(0)  # no interpreter teardown at nice 19
"""


def test_translation_never_uses_httpstans_one_second_stanc(monkeypatch):
    import httpstan.compile

    def refuse(*args, **kwargs):
        raise AssertionError("httpstan.compile.compile runs stanc with timeout=1")

    monkeypatch.setattr(httpstan.compile, "compile", refuse)
    cpp, _ = translate(PROGRAM, "model_eight_schools")
    assert "model_eight_schools" in cpp


def test_a_starved_process_translates():
    """A process at nice 19 translates while a busy process at the normal priority shares its one
    core. The child imports and translates once first, then says when it is ready and is niced and
    pinned to the core, so only the translation measured runs starved (every stanc call robust-stan
    makes goes through the same stanc_process). Its share of the core is then at most 15 / (15 + 1024) (the kernel's weights of
    nice 19 and nice 0), so a translation of a few tens of milliseconds of CPU takes seconds: the
    test asserts it took more than httpstan's one-second limit, which would have failed it."""
    core = min(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", CHILD, PROGRAM], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy = None
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.setpriority(os.PRIO_PROCESS, child.pid, 19)  # niced once ready: its imports ran at full speed
        for pid in (child.pid, busy.pid):
            os.sched_setaffinity(pid, {core})  # stanc, started by the child, inherits its core and nice
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=600)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    done, translated, seconds = out.split()
    assert (done, translated) == ("translated", "True")
    assert float(seconds) > 1.0, f"the translation was not starved: {seconds} s"
