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


@pytest.mark.parametrize(
    ("allow", "loaded"),
    [(None, True), ("dsv41_gfx942", True), ("other,dsv41_gfx942", True), ("other", False),
     ("", False)],
)  # fmt: skip
def test_load_general_plugins_honours_vllm_plugins(fresh_loader, monkeypatch, allow, loaded):
    if allow is not None:
        monkeypatch.setenv("VLLM_PLUGINS", allow)
    fresh_loader.load_general_plugins()
    if loaded:
        assert dsv41_gfx942_plugin.status().startswith("inactive: platform is")
    else:
        assert dsv41_gfx942_plugin.status() is None
    # vLLM loads plugins once per process; a second call runs nothing again.
    fresh_loader.load_general_plugins()
