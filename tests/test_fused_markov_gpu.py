"""ops.fused_markov on a GPU (run on an NVIDIA H200): the issue's rule against vLLM's loop run
eagerly, and the fused launches captured in a CUDA graph and replayed with new seeds.

The H200 has vLLM's Python files only (a carried tarball, no compiled parts): the speculator
cannot be imported there, so vLLM's loop is ``ref_markov.transcribed_loop`` (the loop with the
draft model's hooks written out: embedding, bf16 ``F.linear``, add, vLLM's own ``gumbel_sample``),
and the fused side is ``fused_markov._launch`` on the same state. ``test_fused_markov.py``
checks ``sample_sequential`` itself against the real speculator on the CPU.
"""

from __future__ import annotations

import importlib.util
import os
import types

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
        reason="needs a GPU (and Triton compiling for it)",
    ),
]

if torch.cuda.is_available() and importlib.util.find_spec("vllm._C") is None:
    # vLLM's Python files without its compiled parts: keep vLLM off its CUDA platform.
    import vllm.platforms as _platforms
    from vllm.platforms.interface import UnspecifiedPlatform

    _platforms._current_platform = UnspecifiedPlatform()

import ref_markov as R  # noqa: E402
from dsv41_gfx942_plugin.ops import _markov_check as C  # noqa: E402
from dsv41_gfx942_plugin.ops import fused_markov as F  # noqa: E402
from sanitizer import assert_clean, needs_sanitizer  # noqa: E402

V = 129280


def _check(spec, rows, base3, w1, w2, ref, out):
    return R.check_rule(spec, rows, base3, R.plain_bias_fn(w1, w2, base3.shape[-1]), ref, out)


@pytest.mark.parametrize(
    "vocab,rank,rows,greedy,fp64",
    [
        (V, 256, 1, False, False),
        (V, 256, 8, False, False),
        (V, 256, 64, False, False),
        (V, 256, 256, False, False),
        (V, 256, 1, True, False),
        (V, 256, 24, True, False),
        (V, 256, 40, True, False),
        (V, 256, 200, True, False),
        (50001, 128, 100, True, False),
        (V, 256, 3, False, True),
        (50001, 128, 17, False, False),
    ],
)
def test_matches_vllm_loop(vocab, rank, rows, greedy, fp64):
    spec, w1, w2, base3 = R.make_plain_case(
        vocab=vocab, rank=rank, rows=rows, greedy=greedy, fp64=fp64, seed=rows
    )
    ref, out = R.run_both_plain(spec, rows, base3, w1, w2, F._launch)
    _check(spec, rows, base3, w1, w2, ref, out)


@pytest.mark.parametrize(
    "second", [11, 700, 300 * 128 + 5], ids=["one-block", "one-chunk", "two-chunks"]
)
def test_fp64_ties_keep_the_first_of_equal_block_maxima(second):
    """fp64 noise: each block's best is its first largest key, and each step's token comes from
    a scan of the blocks' bests, ``NB_CHUNK`` at a time, each chunk's maximum taken with the
    first index among equal keys. Zero temperature and two equal largest logits (token 10, and
    ``second`` in the same block, in the same chunk of blocks or in a later one) must give token
    10, as torch's argmax in vLLM's loop does. The CPU test covers the order across chunks;
    within a block or a chunk it is the GPU's ``tl.max`` (the interpreter's keeps the first
    index whatever the tie-break flag). The one-block case passes on an H100; that it fails
    with the flag off is not yet shown on a GPU."""
    spec, w1, w2, base3 = R.make_plain_case(
        vocab=V, rank=256, rows=3, fp64=True, temps=(0.0,), inert=0.0, seed=7
    )
    base3[:, :, 10] = base3[:, :, second] = 1e4  # one bf16 value, the bias far below
    ref, out = R.run_both_plain(spec, 3, base3, w1, w2, F._launch)
    _check(spec, 3, base3, w1, w2, ref, out)
    assert (ref["tokens"][:3] == 10).all() and (out["tokens"][:3] == 10).all()


def _first_step(spec, rows, base3, w1, w2, fused=F._launch, probe=False):
    """``_markov_check.first_step`` on a plain case: the transcribed loop, then ``fused``."""
    vocab = base3.shape[-1]
    spec.model = types.SimpleNamespace(
        markov_embed=lambda prev: torch.nn.functional.embedding(prev, w1),
        markov_bias=lambda embed: torch.nn.functional.linear(embed, w2)[..., :vocab],
    )
    return C.first_step(
        spec,
        rows,
        base3,
        lambda: R.transcribed_loop(spec, rows, base3, w1, w2),
        lambda: fused(spec, rows, base3, w1, w2),
        probe=probe,
    )


@pytest.mark.parametrize(
    "rows,greedy,fp64,seed",
    [(1, False, False, 1), (8, False, False, 2), (64, False, False, 3), (256, False, False, 4),
     (8, True, False, 5), (200, True, False, 6), (3, False, True, 7)],
)  # fmt: skip
def test_first_step_check_passes_the_real_kernels(rows, greedy, fp64, seed):
    """The comparison at first use (ops/_markov_check.py) accepts the kernels on this GPU, at
    the full vocabulary, sampled and greedy, inert and live rows; the output stands."""
    spec, w1, w2, base3 = R.make_plain_case(
        vocab=V, rank=256, rows=rows, greedy=greedy, fp64=fp64, seed=seed
    )
    assert _first_step(spec, rows, base3, w1, w2)[0] is None


@pytest.mark.parametrize(
    "rows,fp64",
    [(1, False), (2, False), (5, False), (8, False), (64, False), (256, False),
     (1, True), (3, True)],
)  # fmt: skip
def test_first_step_probe_passes_the_real_kernels(rows, fp64):
    """From a batch of inert rows (vLLM's warm-up before a capture), the comparison makes the
    compared rows live (ops/_markov_check.py's probe) in each of its rounds of temperatures
    (several at 1, 2 and 3 rows): the kernels pass it at the full vocabulary, the fast noise's
    verify launch included from 17 rows, and what the probe changed is restored."""
    spec, w1, w2, base3 = R.make_plain_case(vocab=V, rank=256, rows=rows, fp64=fp64, inert=1.0)
    state = ("sample_idx_mapping", "sample_pos", "temperature", "seeds", "draft_logits")
    before = {name: getattr(spec, name).clone() for name in state}
    assert _first_step(spec, rows, base3, w1, w2, probe=True) == (None, False)
    for name in state:  # bit for bit (a NaN in the logits cache included)
        now, then = (t.contiguous().view(torch.uint8) for t in (getattr(spec, name), before[name]))
        assert torch.equal(now, then), name


@pytest.mark.parametrize("rows,row", [(8, 2), (256, 255)])
def test_first_step_check_fails_a_wrong_token(rows, row):
    """A token changed in the first row tile, or in the last row of the last one, is refused."""
    spec, w1, w2, base3 = R.make_plain_case(vocab=V, rank=256, rows=rows, temps=(1.0,), inert=0.0)

    def wrong(spec, *args):
        F._launch(spec, *args)
        spec.draft_tokens[row, 1] = (spec.draft_tokens[row, 1] + 1) % V

    why, cached = _first_step(spec, rows, base3, w1, w2, wrong)
    assert why.startswith(f"row {row} step 1: token") and cached


@pytest.mark.parametrize("rows", [8, 64])
def test_cuda_graph_replay_new_seeds(rows):
    """Captured as vLLM captures the draft step (every row inert), replayed with live rows and
    new seeds; each replay against the eager loop from the same state."""
    spec, w1, w2, base3 = R.make_plain_case(vocab=V, rank=256, rows=rows, inert=0.0, seed=7)
    live_idx = spec.sample_idx_mapping.clone()
    F._launch(spec, rows, base3, w1, w2)  # compiles, allocates the scratch
    torch.cuda.synchronize()
    spec.sample_idx_mapping.fill_(-1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        F._launch(spec, rows, base3, w1, w2)
    spec.sample_idx_mapping.copy_(live_idx)
    gen = torch.Generator().manual_seed(rows)
    for _ in range(3):
        spec.seeds.copy_(torch.randint(-(2**62), 2**62, spec.seeds.shape, generator=gen))
        start = R.snapshot(spec)
        R.transcribed_loop(spec, rows, base3, w1, w2)
        ref = R.snapshot(spec)
        R._restore(spec, start)
        graph.replay()
        torch.cuda.synchronize()
        _check(spec, rows, base3, w1, w2, ref, R.snapshot(spec))
    win = F._scratch(spec, base3.device, V)["win"]
    assert (win == -(2**63)).all()


@pytest.mark.parametrize("rows", [12, 64])
def test_extreme_temperatures(rows):
    """As the CPU test of that name, with this GPU's division, compares and denormals (12 rows
    take vLLM's noise in the step kernel, 64 the fast noise with its verify launch): temperatures
    1e-3, 1e-6 (below vLLM's 1e-5 a request is greedy, but its temperature is kept and the draft
    step divides by it), 1e-37, 1.4e-45 (a denormal), 5, 1e4, 3e38 and 0, each on some rows."""
    temps = (1e-3, 1e-6, 1e-37, 1e-45, 5.0, 1e4, 3e38, 0.0)
    spec, w1, w2, base3 = R.make_plain_case(vocab=V, rank=256, rows=rows, inert=0.1, seed=41)
    R.spread_temperatures(spec, rows, temps)
    ref, out = R.run_both_plain(spec, rows, base3, w1, w2, F._launch)
    stats = _check(spec, rows, base3, w1, w2, ref, out)
    assert stats.tokens_equal == stats.tokens


@pytest.mark.parametrize("rows", [8, 64])
def test_greedy_first_nan_wins(rows):
    """NaN base logits in a greedy draft, each right after a token vLLM's loop picks without
    them: the first NaN of a row wins (torch's argmax, vLLM's greedy path), not the larger
    finite logit before it."""
    spec, w1, w2, base3 = R.make_plain_case(vocab=V, rank=256, rows=rows, greedy=True, seed=29)
    start = R.snapshot(spec)
    R.transcribed_loop(spec, rows, base3, w1, w2)
    cols = (spec.draft_tokens[:rows].flatten().unique() + 1).clamp(max=V - 1)
    base3[:, :, cols] = float("nan")
    R._restore(spec, start)
    ref, out = R.run_both_plain(spec, rows, base3, w1, w2, F._launch)
    assert torch.isin(out["tokens"][:rows], cols).all()
    assert torch.equal(out["tokens"][:rows], ref["tokens"][:rows])


@pytest.mark.parametrize("rows", [8, 64])
def test_sampled_nan_never_wins(rows):
    """NaN base logits in a sampled draft (64 rows take the fast noise): a NaN never wins, as in
    vLLM's Gumbel kernel under the interpreter. On a GPU vLLM's block reduction keeps or drops a
    NaN by where it sits, so the reference is vLLM's loop with those logits at -inf. The NaNs sit
    on every token that loop samples without them: a winner that let a NaN through, or lost the
    rest of its block around one, differs."""
    spec, w1, w2, base3 = R.make_plain_case(vocab=V, rank=256, rows=rows, seed=23)
    start = R.snapshot(spec)
    R.transcribed_loop(spec, rows, base3, w1, w2)
    cols = spec.draft_tokens[:rows].flatten().unique()
    dropped, nan = base3.clone(), base3.clone()
    dropped[:, :, cols] = float("-inf")
    nan[:, :, cols] = float("nan")
    R._restore(spec, start)
    R.transcribed_loop(spec, rows, dropped, w1, w2)
    ref = R.snapshot(spec)
    R._restore(spec, start)
    F._launch(spec, rows, nan, w1, w2)
    out = R.snapshot(spec)
    assert not torch.isin(out["tokens"][:rows], cols).any()
    assert torch.equal(out["tokens"][:rows], ref["tokens"][:rows])


def test_fast_noise_takes_the_exact_winner():
    """As the CPU test of that name, with this GPU's fast log and DSv4.1's vocabulary: two tokens
    of equal logits whose fast noises swap vLLM's order; the fused launches sample vLLM's."""
    rows = 64
    cfg = F._config(rows, V, 256, False)
    spec, w1, w2, base3 = R.make_plain_case(
        vocab=V, rank=256, rows=rows, n_spec=1, temps=(1.0,), inert=0.0, seed=5
    )
    from noise_pairs import swapped_pair

    found = swapped_pair(spec, V, cfg["BV"], cfg["FAST_LOG"])
    assert found, "no swapped pair in this row: pick another seed"
    a, b, vllm_token = found
    w2[b] = w2[a]
    base3[:] = float("-inf")
    base3[:, :, a] = base3[:, :, b] = 1.0
    ref, out = R.run_both_plain(spec, rows, base3, w1, w2, F._launch)
    assert int(ref["tokens"][0, 0]) == vllm_token
    assert torch.equal(out["tokens"][:rows], ref["tokens"][:rows])


def test_fast_noise_error_bound():
    """Every fp32 in [2**-33, 1], a superset of the uniforms vLLM's ``murmur3_uniform32`` draws
    (``hi16 * 2**-16 + (lo16 + 0.5) * 2**-32``, never below 2**-33): the fast noise of this GPU's
    ``FAST_LOG`` is finite and within a quarter of ``FAST_NOISE_ERR`` of vLLM's noise, the bound
    the verify launch relies on. H200 (``__nv_fast_logf``): max error 2.05e-05."""
    import triton
    import triton.language as tl

    from dsv41_gfx942_plugin.ops import _markov_math as M

    @triton.jit
    def errors(
        out_ptr, LOW: tl.constexpr, ONE: tl.constexpr, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr
    ):
        bits = LOW + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        u = tl.minimum(bits, ONE).to(tl.int32).to(tl.float32, bitcast=True)
        exact, fast = M._noise32(u, ""), M._noise32(u, FAST_LOG)
        finite = (tl.abs(exact) < float("inf")) & (tl.abs(fast) < float("inf"))
        err = tl.where(finite, tl.abs(fast - exact), float("inf"))
        tl.store(out_ptr + tl.program_id(0), tl.max(err, axis=0))

    block, low, one = 4096, (127 - 33) << 23, 0x3F800000  # the bits of 2**-33 and of 1.0
    out = torch.empty(triton.cdiv(one - low + 1, block), device="cuda")
    fast_log = F._config(256, V, 256, False)["FAST_LOG"]
    assert fast_log == ("log2" if torch.version.hip else "ptx")
    errors[(out.numel(),)](out, low, one, fast_log, block)
    worst = out.max().item()
    print(f"fast noise ({fast_log}): max |error| {worst:.3g} over every fp32 in [2**-33, 1]")
    assert worst <= M.FAST_NOISE_ERR.value / 4


# Launch sets the memcheck run takes: two blocks a program (1 row; 3 rows of fp64 noise), the
# fast noise and its verify launch (17 rows), one block a program (64 rows), each sampled and
# greedy, in a vocabulary of whole blocks and one (50001) whose rows are not 16-byte aligned.
_MEMCHECK = """
import importlib.util
if importlib.util.find_spec("vllm._C") is None:  # as above
    import vllm.platforms as P
    from vllm.platforms.interface import UnspecifiedPlatform
    P._current_platform = UnspecifiedPlatform()
import torch, ref_markov as R
from dsv41_gfx942_plugin.ops import fused_markov as F
for vocab, rank in ((129280, 256), (50001, 128)):
    for rows, greedy, fp64 in ((1, 0, 0), (1, 1, 0), (3, 0, 1), (17, 0, 0), (17, 1, 0), (64, 0, 0)):
        spec, w1, w2, base3 = R.make_plain_case(
            vocab=vocab, rank=rank, rows=rows, greedy=bool(greedy), fp64=bool(fp64), seed=rows)
        F._launch(spec, rows, base3, w1, w2)
torch.cuda.synchronize()
"""


@needs_sanitizer
def test_launches_pass_memcheck():
    """The fused launches under compute-sanitizer's memcheck: no read or write outside an
    allocation, in any kernel of a step (the step kernel, with its block read ahead and its odd
    steps walking backwards; the verify and last launches). H200: 0 errors."""
    assert_clean("memcheck", _MEMCHECK, timeout=600)
