"""The top-k kernels' load-time check (ops/_topk_check.py) on the CPU: it accepts torch's own
answers, ties at the cut picked either way, and names the op whose answer differs; ``build()``
keeps every top-k hook off when the check fails or raises. The ops are replaced by torch
references here (the kernels' own run of the check is tests/test_topk_gpu.py's)."""

from __future__ import annotations

import pytest
import torch

import ref_topk as ref
from dsv41_gfx942_plugin.ops import _launcher, _topk_check, topk


def _take(x: torch.Tensor, cols: torch.Tensor, k: int, wrong: bool) -> torch.Tensor:
    """The ids ``cols`` of the k largest of ``x`` (vLLM's top-k order), then -1; ``wrong``: the
    k + 1 largest but the first (one taken id below the cut)."""
    n, key = min(k, x.numel()), ref.order_key(x)
    top = key.topk(n + 1 if wrong and n < x.numel() else n).indices
    got = cols[top[1:] if wrong and top.numel() > n else top]
    return torch.cat([got.int(), torch.full((k - n,), -1, dtype=torch.int32)])


def _pos(ids: torch.Tensor, taken: torch.Tensor) -> torch.Tensor:
    """The entries of ``ids`` that hold each of ``taken``."""
    return (ids[None, :] == taken[:, None]).int().argmax(1)


def _iota(end: int) -> torch.Tensor:
    return torch.tensor([j if j < end else -1 for j in range(512)], dtype=torch.int32)


class Torch:
    """topk's ops answered by torch; the op named ``wrong`` takes one id below its cut, or,
    named with "1-D", ends each row of 1-D lengths at its request's length (not causally), with
    "zeros" ranks -0 above +0, with "denormals" ranks denormals as zeros of their sign."""

    def __init__(self, wrong: str = ""):
        self.wrong = wrong

    def _values(self, op: str, x: torch.Tensor) -> torch.Tensor:
        if self.wrong == f"{op} zeros":
            return torch.where(x == 0, -x, x)
        if self.wrong == f"{op} denormals":
            return torch.where(x.abs() < torch.finfo(torch.float32).tiny, x * 0, x)
        return x

    def _ends(self, op, logits, next_n, seq_lens, width=1 << 30) -> list[int]:
        rows = logits.shape[0]
        if self.wrong == f"{op} 1-D" and seq_lens.dim() == 1:
            return ref.decode_row_ends(seq_lens.repeat_interleave(next_n)[:, None], rows, 1, width)
        return ref.decode_row_ends(seq_lens, rows, next_n, width)

    def decode(self, logits, next_n, seq_lens, indices, max_blocks=8, min_chunk=16384,
               register_select=True):  # fmt: skip
        op = "decode" if register_select else "general"
        for r, end in enumerate(self._ends(op, logits, next_n, seq_lens, logits.shape[1])):
            if end <= 512:
                indices[r] = _iota(end)
            else:
                cols = torch.arange(end)
                x = self._values(op, logits[r, :end])
                indices[r] = _take(x, cols, 512, self.wrong == "decode")
        return True

    def candidate(self, logits, next_n, seq_lens, cands, bs, indices, k):
        for r, end in enumerate(self._ends("candidate", logits, next_n, seq_lens)):
            cols = ref.candidate_columns(cands[r], bs, end)
            x = self._values("candidate", logits[r, cols])
            indices[r] = _iota(end) if end <= 512 else _take(x, cols, 512,
                                                             self.wrong == "candidate")  # fmt: skip
            if self.wrong == "candidate tail" and end > 512 and cols.numel() < 512:
                indices[r, cols.numel() :] = 0  # not -1 after the live columns
        return True

    def compact(self, logits, ids, seq_lens, next_n, indices):
        for r, end in enumerate(self._ends("compact", logits, next_n, seq_lens)):
            live = ids[r] >= 0
            x = self._values("compact", logits[r][live])
            indices[r] = _iota(end) if end <= 512 else _take(x, ids[r][live], 512,
                                                             self.wrong == "compact")  # fmt: skip
            if self.wrong == "compact repeat" and r == 0:  # one id twice, in place of a tie
                taken = logits[r][_pos(ids[r], indices[r])]
                value = taken[taken.isfinite()].mode().values  # a value several taken ids hold
                i, j = (taken == value).nonzero()[:2, 0].tolist()
                indices[r, j] = indices[r, i]
        return True

    def select(self, logits, next_n, seq_lens, bs, out):
        for r, end in enumerate(ref.select_row_ends(seq_lens, logits.shape[0], next_n)):
            scores = ref.block_scores(logits[r], end, bs)
            live = torch.nonzero(scores != float("-inf")).flatten()
            out[r] = _take(scores[live], live, out.shape[1], self.wrong == "select")
        return True


def _patch(monkeypatch, ops: Torch):
    monkeypatch.setattr(topk, "top_k_per_row_decode_512", ops.decode)
    monkeypatch.setattr(topk, "decode_top_k", lambda x, n, s, i, k: ops.decode(x, n, s, i))
    monkeypatch.setattr(topk, "candidate_top_k", ops.candidate)
    monkeypatch.setattr(topk, "compact_top_k_512", ops.compact)
    monkeypatch.setattr(topk, "select_candidates", ops.select)


@pytest.mark.parametrize("default", [torch.float32, torch.bfloat16])
def test_check_accepts_torch_answers(monkeypatch, default):
    """Also under a bf16 default dtype, as vLLM builds a model (where build() runs the check):
    the check's logits stay fp32, which the kernels take."""
    _patch(monkeypatch, Torch())
    seen = []
    decode = topk.top_k_per_row_decode_512
    monkeypatch.setattr(topk, "top_k_per_row_decode_512",
                        lambda x, *a, **k: seen.append(x.dtype) or decode(x, *a, **k))  # fmt: skip
    old = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        assert _topk_check.check(torch.device("cpu")) is None
    finally:
        torch.set_default_dtype(old)
    assert seen == [torch.float32] * 26


@pytest.mark.parametrize(
    "op, named",
    [("decode", "decode top-512"), ("general 1-D", "decode top-512 (general path, 1-D"),
     ("candidate", "candidate top-k"), ("candidate tail", "candidate top-k (2-D lengths): row 1"),
     ("candidate 1-D", "candidate top-k (1-D lengths): row 0"), ("compact", "compact top-k"),
     ("compact repeat", "compact top-k (2-D lengths): call 0, row 0"),
     ("compact 1-D", "compact top-k (1-D lengths): call 1, row 0"),
     ("select", "candidate selection"),
     ("decode zeros", "decode top-512 (register path, a cut among zeros of both signs): row 0"),
     ("general denormals", "decode top-512 (general path, a cut among zeros of both signs)"),
     ("candidate zeros", "candidate top-k (2-D lengths): row 0 (end 16383)"),
     ("candidate denormals", "candidate top-k (2-D lengths): row 0 (end 16383)"),
     ("compact zeros", "compact top-k (2-D lengths): call 3, row 0 (end 131071)")],
)  # fmt: skip
def test_check_names_the_op_that_differs(monkeypatch, op, named):
    """Each mutation is caught by the call meant for it (the 1-D ones only by the 1-D calls:
    the general path's 1-D rows, the candidate and compact ops' causal ends)."""
    _patch(monkeypatch, Torch(wrong=op))
    differs = _topk_check.check(torch.device("cpu"))
    assert differs is not None and differs.startswith(named), differs


@pytest.mark.parametrize(
    "ends,next_n", [([[-5], [9], [800]], 1), ([1, 700], 3)], ids=["2-D", "1-D causal"]
)
def test_check_row_ends_are_the_top_ks(ends, next_n):
    """The check's row ends (``_ends``) are the top-k's contract (ref_topk.decode_row_ends),
    clamped to [0, width] at both bounds: the causal ends -1, 0, 1 and 698-700 of a width of
    600. The check's own rows end neither below 0 nor past the width, so a wrong clamp would
    show only once rows that do are added (an end below 0 then raises in ``_iota_ok``)."""
    seq = torch.tensor(ends, dtype=torch.int32)
    rows = seq.numel() * (next_n if seq.dim() == 1 else 1)
    assert _topk_check._ends(seq, rows, next_n, 600) == ref.decode_row_ends(seq, rows, next_n, 600)


def test_check_fails_on_recorded_launches(monkeypatch):
    """The real ops with kernels that write nothing (tests/test_topk_hooks.py's recorders)."""
    from test_topk_hooks import FakeScratch, Recorder

    kernels = {name: Recorder(name, []) for name in topk.KERNELS}
    monkeypatch.setattr(topk, "_GPU_TYPE", "cpu")
    monkeypatch.setattr(topk, "_kernels", lambda t: kernels)
    monkeypatch.setattr(topk, "_scratch", FakeScratch())
    monkeypatch.setattr(_launcher, "stream_handle", lambda device: 0)
    assert _topk_check.check(torch.device("cpu")).startswith("decode top-512 (register path, 2-D")


@pytest.mark.parametrize("failure", ["differs", "raises"])
def test_build_keeps_the_hooks_off_when_the_check_fails(monkeypatch, plugin_log, failure):
    def check(device):
        if failure == "raises":
            raise RuntimeError("no memory")
        return "decode top-512 (register path, 2-D lengths): row 0 (end 671744)"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_launcher, "load", lambda *a: object())
    monkeypatch.setattr(_topk_check, "check", check)
    monkeypatch.setattr(topk, "_modules", {})
    assert not topk.build() and topk._modules == {0: None}
    assert not topk.build()  # decided once: no second check, no second warning
    warnings = [r.getMessage() for r in plugin_log.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "vLLM's ops run instead" in warnings[0]
    assert ("no memory" if failure == "raises" else "row 0") in warnings[0]


def test_build_takes_kernels_that_pass(monkeypatch):
    module = object()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_launcher, "load", lambda *a: module)
    monkeypatch.setattr(_topk_check, "check", lambda device: None)
    monkeypatch.setattr(topk, "_modules", {})
    assert topk.build() and topk._modules == {0: module}


def test_a_row_check_refuses_an_id_outside_the_columns():
    """The load-time check's row rule: an id that is not one of the row's columns fails even
    where the nearest column's value would make the top-k's values right (an off-by-one column,
    a masked column)."""
    cols = torch.tensor([0, 2, 4])
    values = torch.tensor([5.0, 3.0, 1.0])
    assert _topk_check._top_row_ok(torch.tensor([2, 0]), values, cols, 2)
    assert not _topk_check._top_row_ok(torch.tensor([0, 1]), values, cols, 2)
    assert not _topk_check._top_row_ok(torch.tensor([0, 4]), values, cols, 2)
