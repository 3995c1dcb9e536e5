"""register(), the vLLM entry point, on the real vllm==0.33.0: activation order, idempotency,
patches landing on vLLM's objects, undo, and an internal error swallowed."""

from __future__ import annotations

import logging

import pytest

from dsv41_gfx942_plugin import patches, patching

INDEXER = patches.INDEXER.target
SAMPLER = patches.SAMPLER.target


def _owner(patch):
    return patching.resolve(f"{patch.module}:{patch.owner}")


#: The INFO line of register() when only the indexer patch landed.
_ACTIVE_INDEXER_ONLY = "dsv41_gfx942 plugin active on gfx942: patched DeepseekV4Indexer.attn_cls"


def _infos(log):
    return [r.getMessage() for r in log.records if r.levelno == logging.INFO]


def test_inactive_on_this_machine(clean_plugin, plugin_log, targets):
    clean_plugin.register()
    clean_plugin.register()  # a second call in the process logs nothing more
    assert clean_plugin.status().startswith("inactive: platform is")
    assert patching.applied() == {}
    for patch, _ in patches.PATCHES:
        assert vars(_owner(patch))[patch.attr] is targets[patch.target]
    infos = _infos(plugin_log)
    assert len(infos) == 1 and "inactive" in infos[0] and "not ROCm" in infos[0]


#: Reasons register() gives for staying inactive, strongest first, each with what causes it.
_INACTIVE = [
    (lambda mp, st: mp.setenv("DSV41_GFX942_DISABLE", "1"), "DSV41_GFX942_DISABLE"),
    (lambda mp, st: mp.setattr("dsv41_gfx942_plugin.vllm_version", lambda: "0.34.0"),
     "vLLM 0.34.0 is not supported"),
    (lambda mp, st: mp.setattr("vllm.platforms._current_platform.is_rocm", lambda: False),
     "not ROCm"),
    (lambda mp, st: setattr(st, "gfx942", False), "not gfx942"),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(_INACTIVE)))
def test_inactive_reasons_in_order(clean_plugin, fake_platform, monkeypatch, plugin_log, case):
    """The off switch wins over a bad version, which wins over the platform, which wins over
    the arch: case i sets its own cause and every weaker one, and register() names its own."""
    for setup, _ in _INACTIVE[case:]:
        setup(monkeypatch, fake_platform)
    reason = _INACTIVE[case][1]
    clean_plugin.register()
    assert reason in clean_plugin.status()
    assert patching.applied() == {}
    assert [m for m in _infos(plugin_log) if "inactive" in m] == [
        f"dsv41_gfx942 plugin inactive: {clean_plugin.status()[len('inactive: ') :]}"
    ]


@pytest.mark.parametrize("no_metadata", ["no dist-info", "dist-info without METADATA"])
@pytest.mark.parametrize(("dunder", "status"), [
    ("0.33.0", "active"),
    ("0.32.1", "inactive: vLLM 0.32.1 is not supported (needs >=0.33,<0.34)"),
    (None, "inactive: no vLLM version found (no distribution metadata, no vllm.__version__)"),
    (0.33, "inactive: no vLLM version found (no distribution metadata, no vllm.__version__)"),
])  # fmt: skip
def test_vllm_without_metadata(clean_plugin, fake_platform, monkeypatch, plugin_log, dunder,
                               status, no_metadata):  # fmt: skip
    """A vLLM installed without its distribution metadata (no dist-info folder; or one without
    its METADATA file, for which Python's ``metadata.version`` returns None) is judged by
    ``vllm.__version__``; with neither (or a ``__version__`` that is no string), the plugin
    stays off with its INFO line (no ERROR, no traceback)."""
    from importlib import metadata

    import vllm

    real = metadata.version

    def version(name):
        if name != "vllm":
            return real(name)
        if no_metadata == "no dist-info":
            raise metadata.PackageNotFoundError(name)
        return None

    monkeypatch.setattr(metadata, "version", version)
    if dunder is None:
        monkeypatch.delattr(vllm, "__version__", raising=False)
    else:
        monkeypatch.setattr(vllm, "__version__", dunder)
    clean_plugin.register()
    assert clean_plugin.status() == status
    assert not [r for r in plugin_log.records if r.levelno >= logging.ERROR]


def test_logger_is_vllms():
    """Under "vllm", so vLLM's handler, format and VLLM_LOGGING_LEVEL apply (Python's
    last-resort handler would drop the INFO lines)."""
    from dsv41_gfx942_plugin import _log

    assert _log.logger.name.startswith("vllm.")


def test_off_switch_checked_before_platform(clean_plugin, monkeypatch):
    monkeypatch.setenv("DSV41_GFX942_DISABLE", "yes")
    monkeypatch.setattr("dsv41_gfx942_plugin.vllm_version", lambda: "1.0.0")
    clean_plugin.register()
    assert clean_plugin.status() == "inactive: turned off by DSV41_GFX942_DISABLE"


def test_platform_gate_asks_functions_vllm_has():
    """The gate's questions (README, How it works: ``current_platform.is_rocm()``,
    ``vllm.platforms.rocm.on_gfx942()``) are vLLM 0.33.0's own functions, called as they are
    declared. The other tests stand in for ``vllm.platforms.rocm``, which imports only with a
    ROCm GPU, so its source is read here: a later 0.33.x without ``on_gfx942`` would make
    register() log an error with a traceback in every process on ROCm instead of deciding."""
    import ast
    import importlib.util
    import inspect
    from pathlib import Path

    from vllm.platforms.interface import Platform

    assert list(inspect.signature(Platform.is_rocm).parameters) == ["self"]
    source = Path(importlib.util.find_spec("vllm.platforms.rocm").origin).read_text()
    [gate] = [node for node in ast.parse(source).body
              if isinstance(node, ast.FunctionDef) and node.name == "on_gfx942"]  # fmt: skip
    assert gate.args.args == gate.args.posonlyargs == gate.args.kwonlyargs == []
    assert gate.args.vararg is None and gate.args.kwarg is None


@pytest.mark.parametrize(("version", "ok"), [("0.33.0", True), ("0.33.7rc1", True),
                                             ("0.32.9", False), ("0.34.0", False),
                                             ("1.33.0", False), ("dev", False),
                                             ("V0.33.0", True), ("0!0.33.0", True),
                                             ("1!0.33.0", False)])  # fmt: skip
def test_version_range(version, ok):
    from dsv41_gfx942_plugin import vllm_supported

    assert vllm_supported(version) is ok


def test_active_patches_land_on_real_vllm(clean_plugin, fake_platform, plugin_log, targets):
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.models.deepseek_v41.attention import DeepseekV4Indexer
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    clean_plugin.register()
    assert clean_plugin.status() == "active"
    assert set(patching.applied()) == {INDEXER, SAMPLER}
    assert DeepseekV4Indexer.attn_cls is not SparseAttnIndexer
    assert issubclass(DeepseekV4Indexer.attn_cls, SparseAttnIndexer)
    assert DSparkSpeculator._sample_sequential is not targets[SAMPLER]
    assert DSparkSpeculator._sample_sequential.__wrapped__ is targets[SAMPLER]
    assert any("active on gfx942" in m for m in _infos(plugin_log))

    # A second register() in the same process changes nothing and logs nothing.
    before = {t: a.replacement for t, a in patching.applied().items()}
    infos = _infos(plugin_log)
    clean_plugin.register()
    assert {t: a.replacement for t, a in patching.applied().items()} == before
    assert _infos(plugin_log) == infos
    assert patches.apply_all() == {INDEXER: "already applied", SAMPLER: "already applied"}

    # Undo restores vLLM's originals exactly.
    assert set(patching.undo_all()) == {INDEXER, SAMPLER}
    assert DeepseekV4Indexer.attn_cls is SparseAttnIndexer
    assert vars(DSparkSpeculator)["_sample_sequential"] is targets[SAMPLER]


def test_hook_family_switches(clean_plugin, fake_platform, monkeypatch, plugin_log):
    monkeypatch.setenv("DSV41_GFX942_FUSED_MARKOV", "0")
    monkeypatch.setenv("DSV41_GFX942_CAND_LOGITS", "0")
    clean_plugin.register()
    # The indexer patch stays while the top-k family is on, the candidate logits off alone.
    assert set(patching.applied()) == {INDEXER}
    assert patches.check_all()[SAMPLER] == "turned off by DSV41_GFX942_FUSED_MARKOV=0"
    assert _ACTIVE_INDEXER_ONLY in _infos(plugin_log)  # the switched-off patch is not named


def test_topk_switch_keeps_the_indexer_unpatched(clean_plugin, fake_platform, monkeypatch):
    """DSV41_GFX942_TOPK=0 keeps every HIP kernel off: the candidate logits, left on, end with
    the HIP compact top-512, so they are off too and the indexer is not patched at all."""
    monkeypatch.setenv("DSV41_GFX942_TOPK", "0")
    clean_plugin.register()
    assert set(patching.applied()) == {SAMPLER}
    assert patches.check_all()[INDEXER] == "turned off by DSV41_GFX942_TOPK=0"


def test_status_names_a_switch_as_set(monkeypatch):
    """A family switch that is not a boolean reads as off; the reason quotes the value set."""
    monkeypatch.setenv("DSV41_GFX942_TOPK", "bogus")
    assert patches.check_all()[INDEXER] == "turned off by DSV41_GFX942_TOPK=bogus"


def test_status_names_the_global_switch(monkeypatch):
    """With DSV41_GFX942_DISABLE every patch is off by it, not by the unset family switches."""
    monkeypatch.setenv("DSV41_GFX942_DISABLE", "1")
    assert set(patches.check_all().values()) == {"turned off by DSV41_GFX942_DISABLE"}


#: (patch, expectation, how) for every parameter list the ledger checks: "grown" by one
#: parameter, and "reordered" (its last two swapped) where it has two.
_SIGNATURE_CHANGES = [(patch, exp, how) for patch, _ in patches.PATCHES for exp in patch.expects
                      if exp.params is not None
                      for how in ("grown", "reordered")[: 1 + (len(exp.params) >= 2)]]  # fmt: skip


def _with_params(names):
    import inspect

    def fake(*args, **kwargs):
        return None

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    fake.__signature__ = inspect.Signature([inspect.Parameter(n, kind) for n in names])
    return fake


@pytest.mark.parametrize("case", range(len(_SIGNATURE_CHANGES)))
def test_every_checked_signature_is_checked(monkeypatch, case):
    """Each vLLM callable of the ledger with one more parameter, or its last two swapped (the
    plugin calls several positionally): the patch does not fit, and the reason names it."""
    patch, exp, how = _SIGNATURE_CHANGES[case]
    names = list(exp.params) + ["extra"]
    if how == "reordered":
        names = [*exp.params[:-2], exp.params[-1], exp.params[-2]]
    module, _, dotted = exp.path.partition(":")
    parent, _, attr = dotted.rpartition(".")
    owner = patching.resolve(f"{module}:{parent}" if parent else module)
    assert patching.check(patch) is None
    monkeypatch.setattr(owner, attr, _with_params(names))
    reason = patching.check(patch)
    assert reason is not None and exp.path in reason and "expected" in reason


def _vllm_names_used(path) -> set[str]:
    """Every "module:name[.attr]" of vLLM that the source file ``path`` imports or reads an
    attribute of (``from vllm.x import y``; ``y.attr`` where y is a module or an object)."""
    import ast
    import importlib

    tree = ast.parse(path.read_text())
    modules, objects = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            for alias in node.names:
                name = alias.asname or alias.name
                try:
                    modules[name] = importlib.import_module(f"{node.module}.{alias.name}").__name__
                except ImportError:
                    objects[name] = f"{node.module}:{alias.name}"
    used = set(objects.values())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in modules:
                used.add(f"{modules[node.value.id]}:{node.attr}")
            elif node.value.id in objects:
                used.add(f"{objects[node.value.id]}.{node.attr}")
    return used


def test_ledger_checks_every_vllm_name_the_indexer_uses():
    """A name of vLLM that indexer.py uses and the indexer patch does not check would, changed
    in a later 0.33.x, fail inside a decode step rather than skip the patch at start-up."""
    from pathlib import Path

    from dsv41_gfx942_plugin import indexer

    expects = patches.INDEXER.expects
    checked = {e.path for e in expects} | {e.is_class for e in expects if e.is_class}
    used = _vllm_names_used(Path(indexer.__file__))
    assert len(used) >= 15  # the parse found the indexer's imports
    missing = {u for u in used if u not in checked and not any(c.startswith(u + ".")
                                                              for c in checked)}  # fmt: skip
    assert not missing


def test_a_switched_off_patch_says_so_before_a_mismatch(monkeypatch):
    """Status names the switch that turned a patch off, though its vLLM target also changed."""
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    monkeypatch.setattr(DSparkSpeculator, "_sample_sequential", _with_params(["self", "x"]))
    assert "expected" in patches.check_all()[SAMPLER]
    monkeypatch.setenv("DSV41_GFX942_FUSED_MARKOV", "0")
    assert patches.check_all()[SAMPLER] == "turned off by DSV41_GFX942_FUSED_MARKOV=0"


def test_changed_signature_is_skipped_with_warning(clean_plugin, fake_platform, monkeypatch,
                                                   plugin_log, targets):  # fmt: skip
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    def changed(self, num_reqs, head_hidden, extra):  # vLLM grew a parameter
        return None

    monkeypatch.setattr(DSparkSpeculator, "_sample_sequential", changed)
    clean_plugin.register()
    assert clean_plugin.status() == "active"
    assert set(patching.applied()) == {INDEXER}  # the rest still applies
    assert DSparkSpeculator._sample_sequential is changed
    assert _ACTIVE_INDEXER_ONLY in _infos(plugin_log)  # the skipped patch is not named
    warnings = [r.getMessage() for r in plugin_log.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and SAMPLER in warnings[0] and "extra" in warnings[0]
    # apply_all() says why for each patch: the check's reason for the one skipped.
    assert patches.apply_all() == {INDEXER: "already applied", SAMPLER: patching.check(
        patches.SAMPLER)} and "extra" in patching.check(patches.SAMPLER)  # fmt: skip


def test_no_patch_applied_is_inactive(clean_plugin, fake_platform, monkeypatch, plugin_log,
                                      targets):  # fmt: skip
    """Every patch switched off or failing its check: nothing is patched, and register() says
    so (status and the INFO line), not "active"."""
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    monkeypatch.setattr(DSparkSpeculator, "_sample_sequential", lambda self, num_reqs: None)
    monkeypatch.setenv("DSV41_GFX942_TOPK", "0")
    clean_plugin.register()
    assert clean_plugin.status() == "inactive: no patch applied"
    assert not patching.applied()
    assert "dsv41_gfx942 plugin inactive on gfx942: no patch applied" in _infos(plugin_log)


@pytest.mark.parametrize("name", ["vllm.forward_context.get_forward_context",
                                  "vllm.compilation.breakable_cudagraph.eager_break_during_capture",
                                  "vllm.config.CUDAGraphMode"])  # fmt: skip
def test_missing_indexer_import_skips_that_patch(clean_plugin, fake_platform, monkeypatch,
                                                 plugin_log, name):  # fmt: skip
    """A later 0.33.x without a name the plugin's indexer module imports: the indexer patch is
    skipped with one warning naming it, and the sampler patch still applies (building the
    replacement would have failed after the checks, and register() undoes every patch then)."""
    monkeypatch.delattr(name)
    clean_plugin.register()
    assert clean_plugin.status() == "active"
    assert set(patching.applied()) == {SAMPLER}
    warnings = [r.getMessage() for r in plugin_log.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and INDEXER in warnings[0] and name.rpartition(".")[2] in warnings[0]


def _assert_left_alone(clean_plugin, plugin_log, monkeypatch, owner, attr, theirs, why):
    """``owner.attr`` set to ``theirs`` before register(): that patch is skipped with a warning
    saying ``why``, ``theirs`` stays, the other patch applies."""
    monkeypatch.setattr(owner, attr, theirs)
    clean_plugin.register()
    assert getattr(owner, attr) is theirs
    target = INDEXER if attr == "attn_cls" else SAMPLER
    assert set(patching.applied()) == {INDEXER, SAMPLER} - {target}
    assert any(target in r.getMessage() and why in r.getMessage()
               for r in plugin_log.records if r.levelno == logging.WARNING)  # fmt: skip


def test_replaced_attn_cls_is_left_alone(clean_plugin, fake_platform, monkeypatch, plugin_log):
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.models.deepseek_v41.attention import DeepseekV4Indexer

    class SomeoneElses(SparseAttnIndexer):
        pass

    _assert_left_alone(clean_plugin, plugin_log, monkeypatch, DeepseekV4Indexer, "attn_cls",
                       SomeoneElses, "expected vLLM's")  # fmt: skip


@pytest.mark.parametrize("how", ["replaced", "wrapped"])
def test_replaced_sampler_is_left_alone(clean_plugin, fake_platform, monkeypatch, plugin_log,
                                        how):  # fmt: skip
    """Another plugin's _sample_sequential with vLLM's parameters is not patched over: the
    fused path's order assumes vLLM's method. "replaced": a function of its own (another
    source file); "wrapped": marked with functools.wraps as wrapping vLLM's, its code compiled
    from vLLM's file (a copy of vLLM's), so only the ``__wrapped__`` test tells it apart."""
    import functools
    import types

    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    def theirs(self, num_reqs, head_hidden):
        return None

    if how == "wrapped":
        vllms = DSparkSpeculator._sample_sequential
        copy = types.FunctionType(vllms.__code__, vllms.__globals__)
        theirs = functools.wraps(vllms)(copy)
    _assert_left_alone(clean_plugin, plugin_log, monkeypatch, DSparkSpeculator,
                       "_sample_sequential", theirs, "not vLLM's own")  # fmt: skip


def test_patch_helper_refuses_twice():
    class Dummy:
        def f(self, a):
            return "orig"

    patch = patching.Patch(module=__name__, owner="Dummy", attr="f",
                           make=lambda orig: lambda self, a: "new")  # fmt: skip
    globals()["Dummy"] = Dummy
    orig_f = vars(Dummy)["f"]
    try:
        assert patching.apply(patch) is True
        replacement = Dummy.f
        assert patching.apply(patch) is False
        assert Dummy.f is replacement and Dummy().f(1) == "new"
        rec = patching.applied()[patch.target]
        assert rec.original is orig_f and rec.replacement is replacement
    finally:
        assert patching.undo_all() == [patch.target]
        del globals()["Dummy"]
    assert Dummy().f(1) == "orig"


def test_patch_of_a_missing_attribute_is_refused(plugin_log):
    """A target vLLM no longer has is not patched (a check naming it, one warning), whatever
    its expectations say: apply() returns False rather than raise (which would make register()
    undo every patch)."""

    class Dummy:
        pass

    patch = patching.Patch(module=__name__, owner="Dummy", attr="gone", make=lambda orig: orig)
    globals()["Dummy"] = Dummy
    try:
        assert patching.check(patch) == f"{patch.target} does not exist"
        assert patching.apply(patch) is False and patching.applied() == {}
    finally:
        del globals()["Dummy"]
    warnings = [r.getMessage() for r in plugin_log.records if r.levelno == logging.WARNING]
    assert warnings == [f"dsv41_gfx942: not patching {patch.target}: {patch.target} does not exist"]


def test_undo_restores_a_descriptor_as_it_was():
    """A static method is replaced and restored as the owner held it (its staticmethod object,
    not the function a lookup returns), and the replacement is built from that object."""

    class Owner:
        @staticmethod
        def f():
            return "orig"

    globals()["Owner"] = Owner
    original = vars(Owner)["f"]
    seen = []
    try:
        patching.apply(patching.Patch(module=__name__, owner="Owner", attr="f",
                                      make=lambda orig: seen.append(orig) or orig))  # fmt: skip
    finally:
        patching.undo_all()
        del globals()["Owner"]
    assert seen == [original] and vars(Owner)["f"] is original and Owner().f() == "orig"


def test_undo_of_inherited_attribute_deletes_it():
    class Base:
        x = 1

    class Child(Base):
        pass

    globals()["Child"] = Child
    try:
        patching.apply(patching.Patch(module=__name__, owner="Child", attr="x",
                                      make=lambda orig: orig + 1))  # fmt: skip
        assert Child.x == 2
    finally:
        patching.undo_all()
        del globals()["Child"]
    assert "x" not in vars(Child) and Child.x == 1


@pytest.mark.parametrize("error", [RuntimeError, AttributeError, TypeError, ValueError, KeyError])
def test_register_swallows_internal_error(clean_plugin, fake_platform, monkeypatch, plugin_log,
                                          error):  # fmt: skip
    """Any exception of the plugin's (not only a RuntimeError) leaves it inactive, undone."""
    from vllm.models.deepseek_v41.attention import DeepseekV4Indexer

    original = DeepseekV4Indexer.attn_cls

    def boom(orig):
        raise error("bug in the plugin")

    # The indexer patch lands, then the sampler's replacement factory fails.
    monkeypatch.setattr(patches, "SAMPLER", patching.Patch(
        patches.SAMPLER.module, patches.SAMPLER.owner, patches.SAMPLER.attr, boom,
        patches.SAMPLER.expects))  # fmt: skip
    monkeypatch.setattr(patches, "PATCHES", ((patches.INDEXER, ("topk",)),
                                             (patches.SAMPLER, ("fused_markov",))))  # fmt: skip
    clean_plugin.register()  # must not raise
    assert clean_plugin.status() == "inactive: internal error"
    assert patching.applied() == {}
    assert DeepseekV4Indexer.attn_cls is original  # what landed first was undone
    errors = [r for r in plugin_log.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "bug in the plugin" in (errors[0].exc_text or "")


def test_register_reentered_while_registering_does_nothing(clean_plugin, fake_platform,
                                                            monkeypatch):  # fmt: skip
    """vLLM's plugin loader reached again from inside register() (an import it triggers): the
    inner call returns at once; the outer one decides."""
    calls = []
    register = clean_plugin._register

    def reentering():
        calls.append(clean_plugin.status())
        clean_plugin.register()
        return register()

    monkeypatch.setattr(clean_plugin, "_register", reentering)
    clean_plugin.register()
    assert calls == ["registering"] and clean_plugin.status() == "active"


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_register_lets_a_base_exception_through(clean_plugin, fake_platform, monkeypatch, error):
    """register() swallows the plugin's errors, not Ctrl-C or an exit during start-up."""

    def stop():
        raise error()

    monkeypatch.setattr(clean_plugin, "_register", stop)
    with pytest.raises(error):
        clean_plugin.register()


def test_register_survives_a_failing_undo(clean_plugin, fake_platform, monkeypatch):
    """Registration fails and undoing it fails too: register() still returns."""

    def fail():
        raise RuntimeError("bug in the plugin")

    with monkeypatch.context() as mp:  # the fixture's own undo runs after it
        mp.setattr(clean_plugin, "_register", fail)
        mp.setattr(patching, "undo_all", fail)
        clean_plugin.register()  # must not raise
    assert clean_plugin.status() == "inactive: internal error"
