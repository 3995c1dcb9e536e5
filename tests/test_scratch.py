"""The top-k's persistent scratch (ops/_launcher.Scratch), on the CPU: buffers a launch had stay
alive when it grows (a captured graph may hold them), buffers only reserved for vLLM's memory
profile do not, and nothing grows inside graph capture."""

from __future__ import annotations

import weakref

import pytest
import torch

from dsv41_gfx942_plugin.ops import _launcher


@pytest.fixture
def scratch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return _launcher.Scratch("cpu")


def held(scratch, device=0):
    return [buf.numel() for buf in scratch._bufs.get(device, [])]


def test_reservations_alone_keep_only_the_largest(scratch):
    """vLLM's profile run reserves at the ratio-2 layers' width first, then at the full one: the
    first buffer is freed before the second is made, and the launch then gets the second."""
    assert scratch.reserve(0, 1000)
    first = weakref.ref(scratch._bufs[0][0])
    assert scratch.reserve(0, 2000)
    assert first() is None and held(scratch) == [2000]
    assert scratch.reserve(0, 1500) and held(scratch) == [2000]  # fits: nothing new
    buf = scratch.get(0, 1800)
    assert buf.numel() == 2000 and buf is scratch._bufs[0][0]


@pytest.mark.parametrize("grow_with", ["reserve", "get"])
def test_a_buffer_a_launch_had_stays_alive(scratch, grow_with):
    """Once a launch was handed a buffer (a graph may have captured it), growing keeps it."""
    assert scratch.reserve(0, 1000)
    launched = scratch.get(0, 1000)
    grown = getattr(scratch, grow_with)(0, 3000)
    assert grown is True or isinstance(grown, torch.Tensor)
    assert held(scratch) == [1000, 3000] and scratch._bufs[0][0] is launched
    # The new one, reserved and not yet launched, gives way again; the launched one stays.
    if grow_with == "reserve":
        assert scratch.reserve(0, 7000) and held(scratch) == [1000, 7000]


def test_growth_doubles_and_devices_are_apart(scratch):
    scratch.get(0, 1000)
    assert scratch.get(0, 1100).numel() == 2000  # at least twice the last: few growths
    assert scratch.reserve(1, 10) and held(scratch, 1) == [10] and held(scratch) == [1000, 2000]


def test_nothing_grows_inside_capture(scratch, monkeypatch):
    scratch.get(0, 1000)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert scratch.get(0, 1000) is scratch._bufs[0][0]  # what fits is handed out
    assert scratch.get(0, 1001) is None
    assert not scratch.reserve(0, 1001)
    assert held(scratch) == [1000]


def test_a_reservation_that_fits_keeps_the_launched_buffer(scratch):
    """vLLM's profile reserving less than a launch already had (a narrower layer) grows
    nothing, so the launched buffer, which a graph may hold, stays when a later call grows."""
    launched = scratch.get(0, 1000)
    assert scratch.reserve(0, 500) and held(scratch) == [1000]
    assert scratch.reserve(0, 3000)
    assert held(scratch) == [1000, 3000] and scratch._bufs[0][0] is launched


def test_a_growth_without_memory_keeps_the_launched_buffer(scratch, monkeypatch):
    """A growth that frees the reserved buffer and then finds no memory leaves no buffer
    marked unlaunched: the next growth must not free the launched one (a graph may hold it)."""
    launched = scratch.get(0, 1000)
    assert scratch.reserve(0, 3000) and held(scratch) == [1000, 3000]
    empty = torch.empty

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("out of memory (test)")

    monkeypatch.setattr(torch, "empty", no_memory)
    with pytest.raises(torch.OutOfMemoryError):
        scratch.get(0, 5000)
    assert held(scratch) == [1000]
    monkeypatch.setattr(torch, "empty", empty)
    assert scratch.get(0, 5000).numel() == 5000
    assert held(scratch) == [1000, 5000] and scratch._bufs[0][0] is launched
