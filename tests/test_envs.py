"""The DSV41_GFX942_* switches: parsing, defaults, one warning for a bad value."""

from __future__ import annotations

import logging

import pytest

from dsv41_gfx942_plugin import envs


@pytest.mark.parametrize(
    ("raw", "value"),
    [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False),
     ("false", False), ("No", False), ("off", False)],
)  # fmt: skip
def test_bool_parsing(monkeypatch, raw, value):
    monkeypatch.setenv("DSV41_GFX942_TOPK", raw)
    assert envs.get_bool("DSV41_GFX942_TOPK") is value


@pytest.mark.parametrize("name", sorted(envs.VARIABLES))
def test_blank_value_is_unset(clean_plugin, monkeypatch, plugin_log, name):
    """A blank value (``VAR=`` in a launch script) means the default, without a warning; the
    status command shows it unset."""
    monkeypatch.setattr(envs, "_warned", set())
    for raw in ("", "  "):
        monkeypatch.setenv(name, raw)
        assert envs.get_bool(name) is envs.VARIABLES[name].default
        assert envs.settings()[name] == f"<unset: {envs.VARIABLES[name].default!r}>"
    assert not [r for r in plugin_log.records if r.levelno == logging.WARNING]


def test_defaults(clean_plugin):
    assert envs.disabled() is False
    assert all(envs.enabled(f) for f in envs.FAMILIES)


@pytest.mark.parametrize(
    ("name", "read_as", "families_on"),
    [("DSV41_GFX942_DISABLE", True, set()),
     ("DSV41_GFX942_TOPK", False, {"fused_markov"}),
     ("DSV41_GFX942_CAND_LOGITS", False, {"topk", "fused_markov"}),
     ("DSV41_GFX942_FUSED_MARKOV", False, {"topk", "cand_logits"}),
     ("DSV41_GFX942_REQUIRE_HIP", True, {"topk", "cand_logits", "fused_markov"})],
)  # fmt: skip
def test_bad_value_leaves_vllm_unchanged_and_warns_once(clean_plugin, monkeypatch, plugin_log,
                                                        name, read_as, families_on):  # fmt: skip
    """A value that is not a boolean (``DISABLE=y``, ``TOPK=maybe``) reads as the side that
    leaves vLLM's own code running, whatever the default: an off switch never fails open (the
    build's switch reads as required; hip/build.py stops the build on it)."""
    monkeypatch.setattr(envs, "_warned", set())
    raw = "y" if name == "DSV41_GFX942_DISABLE" else "maybe"
    monkeypatch.setenv(name, raw)
    for _ in range(2):
        assert envs.get_bool(name) is read_as
        assert {f for f in envs.FAMILIES if envs.enabled(f)} == families_on
    warnings = [r.getMessage() for r in plugin_log.records if r.levelno == logging.WARNING]
    # The build's switch is no runtime switch: its warning says what the build does with it.
    means = ("the wheel build and hip/build.py stop on it" if name == "DSV41_GFX942_REQUIRE_HIP"
             else "the side that leaves vLLM unchanged")  # fmt: skip
    assert warnings == [f"{name}={raw!r} is not a boolean; read as {read_as}, {means}"]
    assert envs.settings()[name] == f"{raw} (read as {read_as})"


def test_global_switch_turns_every_family_off(clean_plugin, monkeypatch):
    monkeypatch.setenv("DSV41_GFX942_DISABLE", "1")
    assert not any(envs.enabled(f) for f in envs.FAMILIES)


def test_unknown_family_is_an_error():
    with pytest.raises(ValueError, match="unknown hook family 'sampler'"):
        envs.enabled("sampler")


def _readme_section(title: str) -> str:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    return readme.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_variable_is_in_the_readme():
    """The README's Switches table is the code's: the same variables (none missing, none the
    code does not read), each with its default as the code has it, and the boolean spellings
    the paragraph above it names. A default changed on one side only fails here."""
    import re

    section = _readme_section("Switches")
    rows = re.findall(r"^\| `(DSV41_GFX942_\w+)` \| `([^`]*)` \|", section, re.M)
    readme = [(name, {"1": True, "0": False}.get(default)) for name, default in rows]
    assert sorted(readme) == sorted((name, v.default) for name, v in envs.VARIABLES.items())
    spelt = re.search(r"`([\w/]+)`, `([\w/]+)`, any case", section)
    assert spelt, "the paragraph naming the boolean spellings"
    assert (set(spelt[1].split("/")), set(spelt[2].split("/"))) == (envs._TRUE, envs._FALSE)


def test_settings_say_which_switch_keeps_a_family_off(clean_plugin, monkeypatch):
    """The status command's settings: a family switched on that another switch keeps off says
    so (TOPK=0 printed CAND_LOGITS as on), and a value prints stripped."""
    monkeypatch.setenv("DSV41_GFX942_TOPK", " Off ")
    shown = envs.settings()
    assert shown["DSV41_GFX942_TOPK"] == "Off (read as False)"
    assert shown["DSV41_GFX942_CAND_LOGITS"] == (
        "<unset: True>, hooks off: needs DSV41_GFX942_TOPK"
    )
    assert shown["DSV41_GFX942_FUSED_MARKOV"] == "<unset: True>"
    monkeypatch.setenv("DSV41_GFX942_DISABLE", "1")
    monkeypatch.setenv("DSV41_GFX942_FUSED_MARKOV", "on")
    shown = envs.settings()
    assert shown["DSV41_GFX942_FUSED_MARKOV"] == (
        "on (read as True), hooks off: DSV41_GFX942_DISABLE is on"
    )
    assert shown["DSV41_GFX942_CAND_LOGITS"].endswith("hooks off: DSV41_GFX942_DISABLE is on")
    assert shown["DSV41_GFX942_TOPK"] == "Off (read as False)"
    assert shown["DSV41_GFX942_REQUIRE_HIP"] == "<unset: False>"
