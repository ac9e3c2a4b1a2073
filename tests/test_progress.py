"""Progress output of steps that report no progress of their own (compiles): a running clock on a
terminal, and into a file or a pipe one line when the step starts and one when it ends."""

import io
import subprocess
import sys
import time

import pytest

from robust_stan.common.progress import elapsed_bar

DESCRIPTION = "Compiling the Stan program"


def test_into_a_file_one_line_at_the_start_and_one_at_the_end(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with elapsed_bar(DESCRIPTION):
        time.sleep(2.3)  # the terminal clock redraws every second; a file must not get those redraws
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0] == f"{DESCRIPTION} ..."
    assert lines[1].startswith(f"{DESCRIPTION}: done in 00:0")
    assert "\r" not in stream.getvalue()


def test_into_a_pipe_one_line_at_the_start_and_one_at_the_end():
    code = ("import time\nfrom robust_stan.common.progress import elapsed_bar\n"
            f"with elapsed_bar({DESCRIPTION!r}):\n    time.sleep(2.3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0] == f"{DESCRIPTION} ..." and lines[1].startswith(f"{DESCRIPTION}: done in ")


def test_a_failed_step_says_it_stopped(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with pytest.raises(RuntimeError), elapsed_bar(DESCRIPTION):
        raise RuntimeError("compile failed")
    assert stream.getvalue().splitlines()[1].startswith(f"{DESCRIPTION}: stopped in ")


def test_nothing_without_show_progress(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with elapsed_bar(DESCRIPTION, show=False):
        pass
    assert stream.getvalue() == ""


def test_a_terminal_keeps_the_running_clock(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    with elapsed_bar(DESCRIPTION):
        time.sleep(1.3)
    assert stream.getvalue().count("\r") >= 2  # redrawn in place
