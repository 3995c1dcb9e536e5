"""The hook counters: what they count, and the one INFO line a process logs at exit."""

from __future__ import annotations

import subprocess
import sys

from dsv41_gfx942_plugin import counters


def test_counts_and_reasons(clean_plugin):
    counters.record("h", True)
    counters.record("h", False, "too wide")
    counters.record("h", False, "too wide")
    counters.record("g", False)
    assert counters.stats() == {
        "g": {"taken": 0, "declined": 1, "reasons": {"declined": 1}},
        "h": {"taken": 1, "declined": 2, "reasons": {"too wide": 2}},
    }
    assert counters.summary() == "g 0/1, h 1/3"
    assert counters.last("h") == (False, "too wide") and counters.last("g") == (False, "declined")
    counters.record("h", True, "ignored")
    assert counters.last("h") == (True, "") and counters.last("f") is None
    counters.reset()  # forgets takes, declines and the latest alike
    assert counters.stats() == {} and counters.summary() == "no hook has run"
    assert counters.last("h") is None


def _run(src: str) -> subprocess.CompletedProcess:
    """A Python process running ``src``, which must exit 0."""
    proc = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc


def test_exit_summary_logged_once_by_any_hook():
    """A process whose only decisions are the sampler's (its indexer not patched) logs them at
    exit too: once, through the plugin's logger (given a handler here, as vLLM's engine
    configures one); a process that records nothing logs nothing."""
    handler = ("import logging, sys; from dsv41_gfx942_plugin import _log, counters; "
               "_log.logger.addHandler(logging.StreamHandler(sys.stderr)); "
               "_log.logger.setLevel(logging.INFO); ")  # fmt: skip
    counted = _run(handler + "counters.record('fused_markov', True); "
                   "counters.record('fused_markov', False, 'x')")  # fmt: skip
    idle = _run(handler)
    line = "dsv41_gfx942 hook counters:"
    assert (counted.stdout + counted.stderr).count(line) == 1
    assert f"{line} fused_markov 1/2" in counted.stderr
    assert line not in idle.stdout + idle.stderr
