"""The tests that signal a child pass however the suite was launched (tests/children.py)."""

import signal
import subprocess
import sys

import pytest
from children import interruptible, sigint_ignored

WAITS = "import time; print('ready', flush=True); time.sleep(60)"


@pytest.mark.processes
def test_a_child_started_under_a_parent_that_ignores_sigint_is_still_interrupted_by_it():
    with sigint_ignored():  # as when the suite runs as a background job of a script
        child = interruptible([sys.executable, "-c", WAITS], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=30)
    finally:
        child.kill()
    assert "KeyboardInterrupt" in stderr and child.returncode != 0


@pytest.mark.processes
def test_a_plainly_started_child_of_such_a_parent_would_ignore_it():
    # what the helper is for: without it the child inherits the ignored signal and sleeps on
    with sigint_ignored():
        child = subprocess.Popen([sys.executable, "-c", WAITS], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        assert child.returncode is None  # still sleeping: the SIGINT was ignored
    finally:
        child.kill()
        child.communicate()
