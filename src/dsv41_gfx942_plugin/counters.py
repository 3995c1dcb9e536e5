"""Per-process counters of each hook's host-side decisions: taken, declined, and why.

A hook records one decision each time its Python runs. On steps that run the breakable graphs
vLLM turns on for DeepSeek-V4.1 on ROCm (mixed steps, and decode steps above the largest capture
size) the indexer's Python runs every step, so the counts are steps; uniform decode steps
replay FULL CUDA graphs (vLLM's default), whose Python runs only while a graph is captured, so
there they count captures, not replays. The status command runs in another process and cannot
see these; read them with ``dsv41_gfx942_plugin.stats()`` inside the vLLM process. A process
that records a decision logs the counts at exit (one INFO line), whichever of its patches made
them.
"""

from __future__ import annotations

import atexit
from collections import Counter, defaultdict

# The DSpark sampler's name: the patch (speculator.py) records its declines, the fused path
# (ops/fused_markov.py) the outcome of each step it did: its launches, or vLLM's loop from the
# base logits it computed (and why).
FUSED_MARKOV = "fused_markov"
# The reason the fused path records for a step whose output is vLLM's loop because it compared
# the two (its first steps): which path serves is not yet decided.
COMPARED = "compared with vLLM's loop"

_taken: Counter[str] = Counter()
_declined: defaultdict[str, Counter[str]] = defaultdict(Counter)
_last: dict[str, tuple[bool, str]] = {}
_exit_log = False  # the exit summary is registered


def record(hook: str, taken: bool, reason: str = "") -> None:
    """Count one decision of ``hook``; ``reason`` says why it declined. The first registers
    the exit summary."""
    global _exit_log
    if not _exit_log:
        _exit_log = True
        atexit.register(_log_summary)
    reason = "" if taken else reason or "declined"
    if taken:
        _taken[hook] += 1
    else:
        _declined[hook][reason] += 1
    _last[hook] = (taken, reason)


def last(hook: str) -> tuple[bool, str] | None:
    """``hook``'s latest decision in this process: (taken, reason), or None before its first."""
    return _last.get(hook)


def stats() -> dict[str, dict]:
    """{hook: {"taken": n, "declined": n, "reasons": {reason: n}}} for this process."""
    hooks = set(_taken) | set(_declined)
    return {
        h: {
            "taken": _taken[h],
            "declined": sum(_declined[h].values()),
            "reasons": dict(_declined[h]),
        }
        for h in sorted(hooks)
    }


def summary() -> str:
    """One line: each hook's calls taken of those it decided (taken/decided)."""
    parts = [f"{h} {s['taken']}/{s['taken'] + s['declined']}" for h, s in stats().items()]
    return ", ".join(parts) if parts else "no hook has run"


def _log_summary() -> None:
    from ._log import logger

    logger.info("dsv41_gfx942 hook counters: %s", summary())


def reset() -> None:
    """Forget every count (tests)."""
    _taken.clear()
    _declined.clear()
    _last.clear()
