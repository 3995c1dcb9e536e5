"""The one helper that applies, records, checks and undoes the plugin's patches of vLLM.

A :class:`Patch` names its target (module, owner, attribute), how to build its replacement, and
what the target must look like for the replacement to be right: the exact parameters of the
functions it replaces or relies on, or the exact class an attribute must still hold. Before
patching, :func:`check` compares these against the installed vLLM; a mismatch skips that patch
with one WARNING naming the target and leaves vLLM untouched there. Every applied patch is
recorded (target, original, replacement), a second apply of the same target is refused, and
:func:`undo_all` restores the originals.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._log import logger


@dataclass(frozen=True)
class Expect:
    """What one vLLM object must be: ``path`` is "module:Owner.attr" or "module:function".

    ``params`` are the parameter names its signature must have, in order; ``is_class`` names
    the class ("module:Class") that the attribute must still hold; ``vllms_own`` requires a
    function defined in that module's own source, not wrapped (so not a replacement from
    another plugin, however alike its parameters).
    """

    path: str
    params: tuple[str, ...] | None = None
    is_class: str | None = None
    vllms_own: bool = False


@dataclass(frozen=True)
class Patch:
    """One replacement of ``owner.attr`` in ``module`` by what ``make(original)`` returns."""

    module: str
    owner: str
    attr: str
    make: Callable[[Any], Any]
    expects: tuple[Expect, ...] = field(default_factory=tuple)

    @property
    def target(self) -> str:
        return f"{self.module}.{self.owner}.{self.attr}"


@dataclass
class Applied:
    """The record of one applied patch: enough to undo it exactly."""

    patch: Patch
    owner: Any
    had_own: bool  # the attribute was in the owner's own __dict__ (else it was inherited)
    original: Any
    replacement: Any


_applied: dict[str, Applied] = {}


def resolve(path: str) -> Any:
    """The object at "module:dotted.name" (raises ImportError/AttributeError if absent)."""
    module_name, _, dotted = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in dotted.split(".") if dotted else ():
        obj = getattr(obj, part)
    return obj


def _params(obj: Any) -> tuple[str, ...]:
    fn = inspect.unwrap(obj)
    return tuple(inspect.signature(fn).parameters)


def _defined_in(fn: Any, module_name: str) -> bool:
    """Whether ``fn`` is a plain function compiled from ``module_name``'s source file."""
    code = getattr(fn, "__code__", None)
    module = importlib.import_module(module_name)
    own = code is not None and code.co_filename == module.__file__
    return own and not hasattr(fn, "__wrapped__")


def check(patch: Patch) -> str | None:
    """Why ``patch`` must not be applied to the installed vLLM, or None if it fits."""
    try:
        owner = resolve(f"{patch.module}:{patch.owner}")
        if not hasattr(owner, patch.attr):
            return f"{patch.target} does not exist"
        for exp in patch.expects:
            obj = resolve(exp.path)
            if exp.params is not None:
                got = _params(obj)
                if got != exp.params:
                    return f"{exp.path} has parameters {got}, expected {exp.params}"
            if exp.is_class is not None and obj is not resolve(exp.is_class):
                return f"{exp.path} is {obj!r}, expected vLLM's {exp.is_class}"
            if exp.vllms_own and not _defined_in(obj, exp.path.partition(":")[0]):
                return f"{exp.path} is {obj!r}, not vLLM's own function"
    except Exception as exc:  # an import error or a missing name: the target is not there
        return f"{type(exc).__name__}: {exc}"
    return None


def apply(patch: Patch) -> bool:
    """Apply ``patch`` if it fits and is not applied yet; True if this call applied it."""
    if patch.target in _applied:
        logger.debug("%s is patched already; not patching it twice", patch.target)
        return False
    reason = check(patch)
    if reason is not None:
        logger.warning("dsv41_gfx942: not patching %s: %s", patch.target, reason)
        return False
    owner = resolve(f"{patch.module}:{patch.owner}")
    had_own = patch.attr in vars(owner)
    original = vars(owner)[patch.attr] if had_own else getattr(owner, patch.attr)
    replacement = patch.make(original)
    setattr(owner, patch.attr, replacement)
    _applied[patch.target] = Applied(patch, owner, had_own, original, replacement)
    logger.debug("dsv41_gfx942: replaced %s", patch.target)
    return True


def applied() -> dict[str, Applied]:
    """The applied patches, by target (a copy)."""
    return dict(_applied)


def undo_all() -> list[str]:
    """Restore every original, newest first; returns the targets restored."""
    restored = []
    for target in reversed(list(_applied)):
        rec = _applied.pop(target)
        if rec.had_own:
            setattr(rec.owner, rec.patch.attr, rec.original)
        else:
            delattr(rec.owner, rec.patch.attr)
        restored.append(target)
    return restored
