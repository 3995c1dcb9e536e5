"""Every ``DSV41_GFX942_*`` environment variable of the plugin, read in this one place.

Values are read when asked for (each vLLM process reads them once, while ``register()`` runs or
a layer is built), so a test can set them with ``monkeypatch.setenv``. Booleans take
``1/true/yes/on`` and ``0/false/no/off`` (any case). Anything else is read as the safe side, with
one warning naming the variable: the runtime switches then leave vLLM's own code running (a value
like ``DISABLE=y`` was meant to turn something off; an off switch must not fail open), and the
build's switch reads as required (``hip/build.py`` stops the build on such a value).

The hook families can be turned off one at a time in production; turning one off leaves vLLM's
own op at that place. The candidate logits end with the HIP compact top-512, so they are off
whenever ``DSV41_GFX942_TOPK`` is: that switch keeps every HIP kernel of the plugin off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class EnvVar:
    """One documented variable: its name, default and what it does."""

    name: str
    default: bool
    help: str
    #: What a value that is not a boolean reads as: the side that leaves vLLM unchanged.
    unreadable: bool
    #: What that reading means, for the warning.
    unreadable_means: str = "the side that leaves vLLM unchanged"


VARIABLES: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            "DSV41_GFX942_DISABLE",
            False,
            "Global off switch: the plugin patches nothing (vLLM runs unchanged).",
            unreadable=True,
        ),
        EnvVar(
            "DSV41_GFX942_TOPK",
            True,
            "HIP top-512, candidate selection (layer 20) and candidate top-k (layers 24-36).",
            unreadable=False,
        ),
        EnvVar(
            "DSV41_GFX942_CAND_LOGITS",
            True,
            "Candidate-only FP8 indexer logits (Gluon) on the reader layers 24-36; they end with "
            "the HIP compact top-512, so they need DSV41_GFX942_TOPK on as well.",
            unreadable=False,
        ),
        EnvVar(
            "DSV41_GFX942_FUSED_MARKOV",
            True,
            "DSpark Markov draft sampling fused to one launch a draft step (Triton).",
            unreadable=False,
        ),
        EnvVar(
            "DSV41_GFX942_REQUIRE_HIP",
            False,
            "Build time: no HIP compiler or source fails the wheel build (ROCm release, CI).",
            unreadable=True,
            unreadable_means="the wheel build and hip/build.py stop on it",
        ),
    )
}

#: Hook family -> the variable that switches it.
FAMILIES = {
    "topk": "DSV41_GFX942_TOPK",
    "cand_logits": "DSV41_GFX942_CAND_LOGITS",
    "fused_markov": "DSV41_GFX942_FUSED_MARKOV",
}

#: Hook family -> the families whose kernels it runs too (off when any of them is off).
NEEDS = {"cand_logits": ("topk",)}

_warned: set[str] = set()


def _warn_once(var: EnvVar, raw: str) -> None:
    if var.name in _warned:
        return
    _warned.add(var.name)
    from ._log import logger

    logger.warning("%s=%r is not a boolean; read as %s, %s",
                   var.name, raw, var.unreadable, var.unreadable_means)  # fmt: skip


def get_bool(name: str) -> bool:
    """The boolean value of a documented variable (its default when unset or unreadable)."""
    var = VARIABLES[name]
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return var.default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    _warn_once(var, raw)
    return var.unreadable


def disabled() -> bool:
    """True when the global off switch is set."""
    return get_bool("DSV41_GFX942_DISABLE")


def enabled(family: str) -> bool:
    """Whether hook ``family`` ("topk", "cand_logits", "fused_markov") may serve: its switch and
    those of the families it ``NEEDS`` are on, and the global switch is off."""
    if family not in FAMILIES:
        raise ValueError(f"unknown hook family {family!r}; expected one of {sorted(FAMILIES)}")
    own = not disabled() and get_bool(FAMILIES[family])
    return own and all(enabled(f) for f in NEEDS.get(family, ()))


def value_as_set(name: str) -> str:
    """A variable's value as set, stripped, for messages ('' when unset or blank)."""
    return os.environ.get(name, "").strip()


def settings() -> dict[str, str]:
    """Every variable as the status command prints it: the value set (stripped) and what it
    reads as, or '<unset: default>', and for a family switched on whose hooks another switch
    keeps off, why (``DSV41_GFX942_TOPK=0`` leaves CAND_LOGITS switched on but unused)."""
    shown = {}
    for name, var in VARIABLES.items():
        value = value_as_set(name)
        shown[name] = f"{value} (read as {get_bool(name)})" if value else f"<unset: {var.default}>"
    for family, name in FAMILIES.items():
        if get_bool(name) and not enabled(family):
            why = (
                "DSV41_GFX942_DISABLE is on"
                if disabled()
                else "needs " + " and ".join(FAMILIES[f] for f in NEEDS[family] if not enabled(f))
            )
            shown[name] += f", hooks off: {why}"
    return shown
