"""The installed distribution's entry point, loaded by vLLM 0.33.0's own plugin loader."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

import dsv41_gfx942_plugin


def test_distribution_exposes_entry_point():
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "dsv41_gfx942"]
    assert len(eps) == 1
    assert eps[0].value == "dsv41_gfx942_plugin:register"
    assert eps[0].load() is dsv41_gfx942_plugin.register


@pytest.fixture
def fresh_loader(clean_plugin, monkeypatch):
    """vLLM's loader as in a new process: plugins not loaded yet, VLLM_PLUGINS unset."""
    import vllm.plugins

    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    return vllm.plugins


#: VLLM_PLUGINS values, and whether vLLM 0.33.0's loader calls register() under each: it splits
#: at commas and compares each name exactly (no stripping, no case folding), so a space, upper
#: case or the package's name instead of the entry point's leaves the plugin out.
_ALLOWLISTS = [
    (None, True), ("dsv41_gfx942", True), ("other,dsv41_gfx942", True), ("dsv41_gfx942,", True),
    ("other", False), ("", False), (",", False), (" dsv41_gfx942", False),
    ("other, dsv41_gfx942", False), ("dsv41_gfx942 ", False), ("DSV41_GFX942", False),
    ("dsv41_gfx942_plugin", False), ("dsv41-gfx942-plugin", False), ("dsv41", False),
]  # fmt: skip


@pytest.mark.parametrize(("allow", "loaded"), _ALLOWLISTS)
def test_load_general_plugins_honours_vllm_plugins(fresh_loader, monkeypatch, allow, loaded):
    """vLLM's own loader under each allowlist, and the status command's verdict on it: the
    command says the plugin is left out exactly where the loader leaves it out, quoting the
    value, and where a name only nearly matches (spaces, case, the package's name) it says
    which one and that vLLM takes names exactly."""
    from dsv41_gfx942_plugin import __main__ as status_command

    if allow is not None:
        monkeypatch.setenv("VLLM_PLUGINS", allow)
    why_not = status_command._not_loaded_by_vllm()
    fresh_loader.load_general_plugins()
    if loaded:
        assert dsv41_gfx942_plugin.status().startswith("inactive: platform is")
        assert why_not is None
    else:
        assert dsv41_gfx942_plugin.status() is None
        assert why_not.startswith(f"VLLM_PLUGINS={allow!r} does not list dsv41_gfx942")
        near = [n for n in allow.split(",") if n not in ("", "other", "dsv41")]
        assert ("vLLM takes each name exactly" in why_not) is bool(near)
        assert all(repr(n) in why_not for n in near)
    # vLLM loads plugins once per process; a second call runs nothing again.
    fresh_loader.load_general_plugins()
