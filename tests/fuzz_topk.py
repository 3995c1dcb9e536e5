"""Seeded fuzz of the top-k hooks against the torch references (``ref_topk``): rows of random
adversarial structures (ties, grids, equal group maxima, masks, zeros of both signs, infinities,
NaN, monotone rows, denormals, one value everywhere, clusters of high logits), widths and row
ends about the kernels' branch points. The CPU emulation runs it at both wave widths
(``test_topk_emu.py``), a GPU on the kernels it loads (``test_topk_gpu.py``: the sm_90 build, or
the shipped gfx942 code object on an MI300X). Every case draws its tensors on the CPU from its
own seed, so a seed names the same case on any device, for one version of this file: the
one-value and cluster rows, added after the GPU runs of seeds up to 14283, changed which case a
seed names (gcov of the emulation, 600 cases at wave 64: with them 1365 of ``topk_select.h``'s
lines counted per kernel copy and 1216 branch arcs, without them 1302 and 1159)."""

from __future__ import annotations

import random

import torch

import ref_topk as ref
from dsv41_gfx942_plugin.ops import topk


def run(cases: int, seed: int, device, label: str) -> None:
    """``cases`` random calls of the four hooks, each checked; the failing case's seed is in
    the message."""
    rng = random.Random(seed)
    for case in range(cases):
        s = rng.randrange(1 << 30)
        fuzz = rng.choice([decode, candidates, compact, select])
        try:
            fuzz(random.Random(s), torch.Generator().manual_seed(s), device)
        except AssertionError as err:
            raise AssertionError(f"{label} case {case}, {fuzz.__name__} seed {s}") from err


def _lens(ends, device) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32, device=device).view(-1, 1)


def _out(rows: int, device) -> torch.Tensor:
    return torch.full((rows, 512), 12345, dtype=torch.int32, device=device)


def _row(n: int, rng: random.Random, g: torch.Generator) -> torch.Tensor:
    """One row of ``n`` logits of a random adversarial structure."""
    x = torch.randn(n, generator=g)
    kind = rng.choice(["randn", "ties", "grid", "max_every", "masked", "zeros", "inf", "nan",
                       "monotone", "tiny", "one", "cluster"])  # fmt: skip
    if kind == "one":  # one value everywhere: every key ties, every group maximum is one key
        x = torch.full((n,), rng.choice([1.0, 0.0, float("-inf"), float("inf"), float("nan")]))
    elif kind == "cluster":  # high logits in one span or a periodic band: a chunk's list overfills
        lift = rng.choice([3.0, 6.0, 20.0])
        if rng.random() < 0.5:
            span = rng.choice([rng.randint(1, 600), rng.randint(600, 9000)])
            at = rng.randint(0, max(0, n - span))
            x[at : at + span] += lift
        else:
            period = rng.choice([64, 1024, 4096])
            x[torch.arange(n) % period < rng.randint(1, period // 2)] += lift
    elif kind == "ties":
        x = torch.randint(0, rng.choice([2, 3, 50]), (n,), generator=g).float()
    elif kind == "grid":
        x = (x * 4).round() / 4
    elif kind == "max_every":  # one value atop every group of m: equal group maxima
        x = torch.rand(n, generator=g) * 0.5
        x[:: rng.choice([2, 3, 4, 8, 16])] = 1.0
    elif kind == "masked":
        keep = torch.rand(-(-n // 8), generator=g) < rng.choice([0.01, 0.125, 0.5])
        x[~keep.repeat_interleave(8)[:n]] = float("-inf")
    elif kind == "zeros":  # of one sign, or of both (-0 ranks below +0)
        x[torch.rand(n, generator=g) < 0.95] = rng.choice([0.0, -0.0])
        if rng.random() < 0.5:
            flip = (x == 0) & (torch.rand(n, generator=g) < 0.5)
            x[flip] = -x[flip]
    elif kind == "inf":
        x[torch.rand(n, generator=g) < rng.choice([0.01, 0.2, 0.9])] = rng.choice(
            [float("inf"), float("-inf")]
        )
    elif kind == "nan":
        u = torch.rand(n, generator=g)
        x[u < rng.choice([0.001, 0.05, 0.3])] = float("nan")
        x[u > 0.9] = float("-inf")
    elif kind == "monotone":
        x = torch.linspace(0, 1, n) if rng.random() < 0.5 else torch.linspace(1, 0, n)
    elif kind == "tiny":  # denormals and zeros
        x = torch.randint(0, 3, (n,), generator=g).float() * 1e-40
    return x


def decode(rng, g, device):
    # Widths and ends about the kernels' branch points: a chunk's valid group maxima (two keys
    # a group in its threads' first float4s) below k and 2k (1,024 and 2,048 live keys);
    # several chunks with a short last one.
    near = rng.randint(1000, 4200)
    width = rng.choice([rng.randint(4, 3000), near, rng.randint(3000, 40000), 16384 + near])
    rows = rng.randint(1, 3)
    x = torch.stack([_row(width, rng, g) for _ in range(rows)]).to(device)
    ends = [rng.choice([width, rng.randint(0, width), near]) for _ in range(rows)]
    seq, idx = _lens(ends, device), _out(rows, device)
    if rng.random() < 0.7:
        assert topk.decode_top_k(x, 1, seq, idx, 512)
    else:
        blocks, chunk = rng.randint(1, 16), rng.choice([1, 100, 1000, 16384])
        topk.top_k_per_row_decode_512(x, 1, seq, idx, blocks, chunk, register_select=False)
    ref.check_decode(x, 1, seq, idx, f"decode {width} {ends}")


def candidates(rng, g, device):
    bs = rng.choice([8, 8, 4, 1, 3])
    ncand = rng.choice([rng.randint(1, min(2048, 16384 // bs)), rng.randint(100, 600)])
    width = rng.choice([ncand * bs + rng.randint(0, 5000), 131072])
    x = _row(width, rng, g).view(1, -1).to(device)
    cands = torch.randint(0, -(-width // bs), (1, ncand), generator=g, dtype=torch.int32)
    cands[torch.rand(cands.shape, generator=g) < rng.choice([0, 0.1, 0.6])] = -1
    cands = cands.to(device)
    end = rng.choice([width, rng.randint(0, width)])
    seq, idx = _lens([end], device), _out(1, device)
    assert topk.candidate_top_k(x, 1, seq, cands, bs, idx, 512)
    ref.check_candidates(x, 1, seq, cands, bs, idx, f"candidates {bs} {ncand} {end}")


def compact(rng, g, device):
    n = rng.choice([rng.randint(1, 2048), rng.randint(1, 16384)])
    x = _row(n, rng, g).view(1, -1).to(device)
    ids = torch.randperm(1 << 20, generator=g)[:n].int().view(1, -1)
    ids[torch.rand(ids.shape, generator=g) < rng.choice([0, 0.1, 0.5, 0.9])] = -1
    if rng.random() < 0.3:  # fewer than 512 live lanes of each 512
        ids[0, torch.arange(n) % 512 >= rng.randint(1, 511)] = -1
    ids = ids.to(device)
    seq, idx = _lens([rng.choice([10**6, rng.randint(0, 600)])], device), _out(1, device)
    assert topk.compact_top_k_512(x, ids, seq, 1, idx)
    ref.check_compact(x, ids, 1, seq, idx, f"compact {n}")


def select(rng, g, device):
    bs = rng.choice([8, 8, 4, 1, 16, 3])
    width = max(1, rng.randint(1, 3000) * bs - rng.randint(0, bs - 1))
    x = _row(width, rng, g).view(1, -1).to(device)
    k = rng.choice([2048, 512, rng.randint(1, 4096)])
    seq = _lens([rng.choice([width, rng.randint(-5, width + 50)])], device).view(-1)
    cands = torch.full((1, k), 777, dtype=torch.int32, device=device)
    assert topk.select_candidates(x, 1, seq, bs, cands)
    ref.check_select(x, 1, seq, bs, cands, f"select {bs} {width} {k}")
