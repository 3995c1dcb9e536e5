"""ops.fused_markov against vLLM 0.33.0's real ``DSparkSpeculator._sample_sequential`` (CPU).

Both paths run on the same speculator state (``ref_markov.make_case``: vLLM's own
``DSparkMarkovHead`` and ``LogitsProcessor``), the Triton kernels (ours and vLLM's Gumbel kernel)
in the interpreter, and ``ref_markov.check_rule`` applies the issue's rule (``check_step``: with
vLLM's token at every row and step, as every seeded case gives it). The cases are sampled
over vocabularies that are not multiples of the block, ranks, row counts 1..64 and 256, 1..7
draft steps, temperatures 0/0.3/1/2 (and 1.4e-45 to 3e38 in one test), inert rows, greedy and
probabilistic drafts, fp32 and fp64 noise, ties, -inf; plus one 129280-token case. Every
``_why_not`` reason is checked with a spy on the kernels, and the other side of each numeric
boundary is taken.

The interpreter must be on before vLLM or the plugin decorate their kernels, so this module sets
``TRITON_INTERPRET=1`` and ``CUDA_VISIBLE_DEVICES=`` when no GPU is visible and nobody set them
(``tests/run.sh`` sets them in CI); with a GPU and no interpreter it skips (see
``test_fused_markov_gpu.py``).
"""

from __future__ import annotations

import copy
import os

import torch

if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ref_markov as R  # noqa: E402
from dsv41_gfx942_plugin.ops import _markov_kernels as K  # noqa: E402
from dsv41_gfx942_plugin.ops import _markov_math as M  # noqa: E402
from dsv41_gfx942_plugin.ops import fused_markov as F  # noqa: E402


def _interpreted() -> bool:
    """Triton's library, vLLM's Gumbel helpers and our kernels all decorated under the
    interpreter (a module imported before TRITON_INTERPRET was set keeps JIT functions that
    the interpreter cannot call)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from vllm.v1.worker.gpu.sample import gumbel

    return all(
        isinstance(f, InterpretedFunction)
        for f in (tl.standard.zeros, gumbel.murmur3_uniform32, K._markov_step_kernel)
    )


pytestmark = pytest.mark.skipif(
    not _interpreted(),
    reason="runs Triton in the interpreter: CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 (run.sh)",
)


# (vocab, rank, rows, steps, greedy, fp64, seed): a sample of the space, not its product.
CASES = [
    (1000, 64, 1, 5, False, False, 1),
    (1000, 64, 3, 5, True, False, 2),
    (1500, 128, 5, 7, False, True, 3),
    (333, 64, 20, 3, False, False, 4),
    (2053, 64, 64, 2, False, False, 5),
    (700, 64, 256, 1, False, False, 6),
    (1025, 64, 8, 4, True, False, 7),
    (999, 192, 12, 6, False, True, 8),
    (4097, 64, 2, 1, False, False, 9),
    (1031, 128, 33, 2, True, False, 10),
    (517, 64, 17, 5, False, False, 11),
    (1000, 64, 7, 5, False, True, 12),
    (600, 64, 20, 3, False, True, 13),  # fp64 past 16 rows: exact noise, two row tiles
    (800, 64, 4, 3, True, True, 14),  # greedy with use_fp64_gumbel: no noise either way
]


@pytest.fixture(autouse=True)
def _fresh_logs(monkeypatch):
    monkeypatch.setattr(F, "_logged", set())
    monkeypatch.setattr(F, "_broken", set())


@pytest.mark.parametrize("vocab,rank,rows,steps,greedy,fp64,seed", CASES)
def test_matches_vllm_loop(vocab, rank, rows, steps, greedy, fp64, seed, monkeypatch):
    verify = _Spy(K._markov_verify_kernel)
    monkeypatch.setattr(K, "_markov_verify_kernel", verify)
    spec, hidden = R.make_case(
        vocab=vocab, rank=rank, rows=rows, n_spec=steps, greedy=greedy, fp64=fp64, seed=seed
    )
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential)
    assert took
    R.check_step(spec, rows, hidden, ref, out)
    # Only sampled fp32 drafts past 16 rows take the fast noise and a verify launch a step (the
    # count is what tells: fp64 sent there would give the same tokens, as it ignores the keys).
    assert verify.launches == (steps if rows > 16 and not (greedy or fp64) else 0)


@pytest.mark.parametrize(("greedy", "fp64"), [(False, False), (True, False), (False, True)])
def test_transcribed_loop_is_vllms_loop(greedy, fp64):
    """``ref_markov.transcribed_loop``, vLLM's loop on the GPU test machine (where the speculator
    cannot be imported), is vLLM's real ``_sample_sequential`` here: the same tokens and cached
    logits bit for bit, from the same state (ties, -inf, a row of -inf, inert rows, temperature
    0 to 2), for greedy and sampled drafts, fp32 and fp64 noise."""
    spec, hidden = R.make_case(vocab=1000, rows=5, n_spec=4, greedy=greedy, fp64=fp64, seed=61)
    head = spec.model.model.markov_head
    start = R.snapshot(spec)
    R.vllm_sample_sequential()(spec, 5, hidden)
    ref = R.snapshot(spec)
    R._restore(spec, start)
    base3 = R.model_base(spec, 5, hidden)
    R.transcribed_loop(spec, 5, base3, head.markov_w1.weight, head.markov_w2.weight)
    out = R.snapshot(spec)
    assert not torch.equal(ref["tokens"], start["tokens"])
    assert torch.equal(out["tokens"], ref["tokens"])
    if not greedy:
        assert torch.equal(out["cache"].view(torch.int16), ref["cache"].view(torch.int16))


def test_temperatures_and_inert_rows():
    """Every temperature, all rows inert (as during vLLM's CUDA graph capture), then all live."""
    for inert, temps in ((1.0, (1.0,)), (0.0, (0.3,)), (0.0, (2.0,)), (0.0, (0.0,))):
        spec, hidden = R.make_case(vocab=1200, rows=6, n_spec=3, temps=temps, inert=inert, seed=21)
        took, ref, out = R.run_both(spec, 6, hidden, F.sample_sequential)
        assert took
        R.check_step(spec, 6, hidden, ref, out)


@pytest.mark.parametrize("rows", [12, 20])
def test_extreme_temperatures(rows, monkeypatch):
    """Temperatures far outside the issue's 0-2, on the exact noise (12 rows) and on the fast
    noise with its verify launch (20 rows): 1e-3 and 1e-37 (``y = logits / temperature`` large;
    at 1e-37 the noise vanishes in its rounding and ties decide), 1.4e-45 (a denormal: every
    nonzero logit overflows to +-inf, the first +inf of a row wins), 5, 1e4 and 3e38 (logits /
    temperature near 0: the noise decides), and 0. vLLM's tokens everywhere."""
    verify = _Spy(K._markov_verify_kernel)
    monkeypatch.setattr(K, "_markov_verify_kernel", verify)
    temps = (1e-3, 1e-37, 1e-45, 5.0, 1e4, 3e38, 0.0)
    spec, hidden = R.make_case(vocab=700, rows=rows, n_spec=3, inert=0.1, seed=41)
    R.spread_temperatures(spec, rows, temps)
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential)
    assert took
    R.check_step(spec, rows, hidden, ref, out)
    assert verify.launches == (3 if rows > 16 else 0)


def test_full_vocabulary():
    """DSv4.1's vocabulary and rank: 129280 x 256, 2 rows, 5 steps."""
    spec, hidden = R.make_case(vocab=129280, rank=256, rows=2, n_spec=5, temps=(1.0, 0.3), seed=31)
    took, ref, out = R.run_both(spec, 2, hidden, F.sample_sequential)
    assert took
    R.check_step(spec, 2, hidden, ref, out)


@pytest.mark.parametrize("rows,greedy", [(1, False), (3, True), (5, False)])
def test_padded_tile_folds_to_the_rows(rows, greedy, monkeypatch):
    """The GPU's padding: 16-row GEMM tiles for fewer rows, folded before the epilogue."""
    monkeypatch.setattr(F, "INTERP_MIN_TILE", 16)
    assert F._config(rows, 900, 64, True)["R_TILE"] == 16
    spec, hidden = R.make_case(vocab=900, rows=rows, n_spec=3, greedy=greedy, seed=70 + rows)
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential)
    assert took
    R.check_step(spec, rows, hidden, ref, out)


@pytest.mark.parametrize(
    "greedy,fp64,vocab", [(True, False, 1500), (False, True, 1500), (False, False, 1200)]
)
def test_many_vocabulary_blocks(greedy, fp64, vocab, monkeypatch):
    """Drafts over several vocabulary blocks (the interpreter's own block holds the other cases'
    vocabularies whole), two blocks a program (small batches, BLOCKS), the last program one of
    them when the blocks are odd: the winner over the blocks' packed keys, and fp64's scan of
    the blocks' bests, each keeping the first of equal maxima."""
    monkeypatch.setattr(F, "BV_INTERP", 256)
    cfg = F._config(4, vocab, 64, True, greedy=greedy)
    assert cfg["BLOCKS"] == 2 and -(-vocab // cfg["BV"]) == (6 if vocab == 1500 else 5)
    spec, hidden = R.make_case(vocab=vocab, rows=4, n_spec=3, greedy=greedy, fp64=fp64, seed=90)
    took, ref, out = R.run_both(spec, 4, hidden, F.sample_sequential)
    assert took
    R.check_step(spec, 4, hidden, ref, out)


@pytest.mark.parametrize("first,second", [(10, 700), (700, 1300)])
def test_fp64_scan_keeps_the_first_of_equal_block_maxima(first, second, monkeypatch):
    """fp64 noise: each step's token comes from a scan of the vocabulary blocks' bests,
    ``NB_CHUNK`` blocks at a time, which must keep the first of equal maxima across chunks too
    (torch's argmax in vLLM's loop; DSv4.1's 1010 blocks of 128 take 8 chunks). Chunks of 2
    blocks of 256 here; zero temperature (no noise) and two equal largest logits make the tie,
    which the other cases' random rows hardly ever do: in blocks 0 and 2 (chunks 0 and 1), and
    in blocks 2 and 5 (chunks 1 and 2: the winner's block counted from its chunk's start)."""
    monkeypatch.setattr(F, "BV_INTERP", 256)
    monkeypatch.setattr(F, "NB_CHUNK", 2)
    spec, hidden = R.make_case(
        vocab=1500, rows=4, n_spec=3, fp64=True, temps=(0.0,), inert=0.0, seed=95
    )
    spec.model.base[:, first] = spec.model.base[:, second] = 1e4  # the bias far below
    took, ref, out = R.run_both(spec, 4, hidden, F.sample_sequential)
    assert took
    assert torch.equal(out["tokens"][:4], ref["tokens"][:4])
    assert (out["tokens"][:4] == first).all()


@pytest.mark.parametrize("from_anchor", [True, False], ids=["anchor-first", "bonus-first"])
def test_a_replay_in_the_state_vllms_prepare_kernel_leaves(from_anchor):
    """The sampling state as vLLM's own ``prepare_dflash_inputs`` writes it before a FULL graph's
    replay of 6 rows: 4 requests in their request slots (one a prefill chunk, its anchor the
    next prompt token), then the graph's 2 padded rows (request -1, position 0, anchor token 0);
    anchors every N query tokens (DSpark's anchor-first layout) or every 1 + N (the
    speculators checkpoints' layout). The fused step is vLLM's loop's."""
    from types import SimpleNamespace

    import numpy as np
    from vllm.v1.worker.gpu.input_batch import InputBuffers
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import prepare_dflash_inputs

    n_spec, graph_rows, rows, slots, vocab = 3, 6, 4, 8, 333
    nq = n_spec if from_anchor else n_spec + 1
    spec, hidden = R.make_case(
        vocab=vocab, rows=graph_rows, n_spec=n_spec, max_num_reqs=slots, seed=93
    )
    spec.num_query_per_req = nq
    spec._anchor_idx = torch.arange(slots) * nq
    spec.input_buffers = InputBuffers(slots, 64, torch.device("cpu"))
    gen = torch.Generator().manual_seed(94)
    # Three verified drafts of 3 and a prefill chunk of 3 tokens, at their positions.
    starts = (100, 7, 50, 20)
    batch = SimpleNamespace(
        num_reqs=rows,
        num_scheduled_tokens=np.array([4, 4, 4, 3], dtype=np.int32),
        positions=torch.cat([s + torch.arange(4) for s in starts])[:15],
        query_start_loc=torch.tensor([0, 4, 8, 12, 15], dtype=torch.int32),
        idx_mapping=torch.tensor([5, 0, 7, 2]),
    )
    temps = torch.tensor([0.0, 0.9, 1.3, 0.5, 0.8, 0.7, 0.6, 1.0])  # slots 0, 2, 5, 7: 0 to 1.3
    prepare_dflash_inputs(
        spec.input_buffers,
        torch.zeros(64, dtype=torch.int64),
        torch.zeros(64, dtype=torch.int64),
        torch.zeros(64, dtype=torch.int64),
        spec.sample_indices,
        spec.sample_pos,
        spec.sample_idx_mapping,
        spec.temperature,
        spec.seeds,
        batch,
        torch.tensor([2, 1, 4, 0], dtype=torch.int32),  # tokens sampled (0: a prefill chunk)
        torch.tensor([2, 3, 0, 0], dtype=torch.int32),  # drafts rejected
        torch.randint(0, vocab, (slots, 1), generator=gen),
        torch.randint(0, vocab, (1, slots), generator=gen).to(torch.int32),
        temps,
        torch.randint(-(2**63), 2**63 - 1, (slots,), generator=gen),
        torch.arange(1, 1 + slots * 16, dtype=torch.int32).view(slots, 16),
        16,
        0,
        1,
        1,
        vocab - 1,
        nq,
        n_spec,
        slots,
        64,
        4096,
        from_anchor,
    )
    idx = spec.sample_idx_mapping[: graph_rows * n_spec].view(graph_rows, n_spec)
    assert idx[:rows, 0].tolist() == [5, 0, 7, 2] and (idx[rows:] == -1).all()
    assert (spec.input_buffers.input_ids[spec._anchor_idx[rows:graph_rows]] == 0).all()
    took, ref, out = R.run_both(spec, graph_rows, hidden, F.sample_sequential)
    assert took
    R.check_step(spec, graph_rows, hidden, ref, out)
    assert torch.equal(ref["tokens"], out["tokens"])  # the rows past the graph's too


def test_repeated_calls_share_clean_scratch():
    """The packed winners are reset by every call: later calls with other rows and seeds agree."""
    spec, hidden = R.make_case(vocab=900, rows=5, n_spec=4, max_num_reqs=8, seed=41)
    win = F._scratch(spec, spec.device, 900)["win"]
    for rows, seed in ((5, 1), (3, 2), (5, 3), (1, 4)):
        spec.seeds.random_(generator=torch.Generator().manual_seed(seed))
        took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential)
        assert took
        R.check_step(spec, rows, hidden, ref, out)
        assert (win == -(2**63)).all()


def test_nan_logits():
    """NaN base logits. Greedy: the first NaN wins, as torch's argmax (vLLM's greedy path), also
    over a larger finite logit before it. Sampled: a NaN never wins, as in vLLM's Gumbel kernel
    under the interpreter (on a GPU its block reduction keeps or drops a NaN by position); the
    cache holds the NaNs as vLLM's."""
    for greedy in (True, False):
        spec, hidden = R.make_case(vocab=800, rows=4, n_spec=3, greedy=greedy, seed=51)
        if greedy:
            spec.model.base[:, 5] = 1000.0
        spec.model.base[:, 77] = float("nan")
        spec.model.base[:, 500] = float("nan")
        took, ref, out = R.run_both(spec, 4, hidden, F.sample_sequential)
        assert took
        assert torch.equal(out["tokens"][:4], ref["tokens"][:4])
        assert ((out["tokens"][:4] == 77).all()) == greedy
        if not greedy:
            R.check_step(spec, 4, hidden, ref, out)


@triton.jit
def _winner_kernel(
    y_ptr, valid_ptr, best_ptr, col_ptr, R: tl.constexpr, BV: tl.constexpr, NAN_MAX: tl.constexpr
):
    r = tl.arange(0, R)
    at = r[:, None] * BV + tl.arange(0, BV)[None, :]
    best, col = M._first_max(tl.load(y_ptr + at), tl.load(valid_ptr + at) != 0, BV, NAN_MAX)
    tl.store(best_ptr + r, best)
    tl.store(col_ptr + r, col)


def _order_keys(y: torch.Tensor, valid: torch.Tensor, nan_max: bool) -> torch.Tensor:
    """``_markov_math._order32`` in torch, masked entries at -2**31."""
    y = torch.where(y == 0, torch.zeros_like(y), y)
    b = y.view(torch.int32)
    o = torch.where(b >= 0, b, b ^ 0x7FFFFFFF)
    o = torch.where(y.isnan(), 0x7FFFFFFF if nan_max else -(2**31), o)
    return torch.where(valid, o, -(2**31))


@pytest.mark.parametrize("nan_max", [False, True])
def test_block_winner_is_the_first_largest_key(nan_max):
    """``_first_max`` (float compares) against each row's largest ``_order32`` key and the first
    column holding it (the block winner's rule), on adversarial rows: rounded values (ties), zeros
    of both signs, -inf, +inf twice, NaN before and after the maximum, rows of NaN only and of NaN
    and -inf. Greedy (``nan_max``): the first NaN wins, masked entries only at a row's tail, as the
    step kernel has them. Sampled: a NaN never wins, masked entries anywhere, rows with none."""
    gen = torch.Generator().manual_seed(3 + nan_max)
    rows, bv = 16, 64
    y = torch.randn(rows, bv, generator=gen).round()
    y[1] = 0.0
    y[1, ::3] = -0.0
    y[2] = float("-inf")
    y[3, 10] = float("nan")
    y[4] = float("nan")
    y[5] = float("-inf")
    y[5, 7] = float("nan")
    y[6, 5], y[6, 40] = 100.0, float("nan")
    y[7, 3] = y[7, 50] = float("inf")
    y[8, 0] = y[8, 63] = float("nan")
    if nan_max:
        ends = torch.randint(1, bv + 1, (rows, 1), generator=gen)
        ends[:9] = bv
        valid = torch.arange(bv)[None, :] < ends
    else:
        valid = torch.rand(rows, bv, generator=gen) < 0.8
        valid[:9] = True
        valid[9] = False
    best, col = torch.empty(rows, dtype=torch.int32), torch.empty(rows, dtype=torch.int32)
    _winner_kernel[(1,)](y, valid.to(torch.int8), best, col, R=rows, BV=bv, NAN_MAX=nan_max)
    keys = _order_keys(y, valid, nan_max)
    ref_best, ref_col = keys.max(dim=1)  # the first of equal maxima
    assert torch.equal(best, ref_best.to(torch.int32))
    assert torch.equal(col, ref_col.to(torch.int32))


@triton.jit
def _xcd_kernel(out_ptr, total, XCDS: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.arange(0, BLOCK)
    tl.store(out_ptr + lin, M._xcd_order(lin, total, XCDS), mask=lin < total)


@pytest.mark.parametrize("total", [1, 7, 8, 9, 63, 1010, 2020, 8 * 1010 + 5])
@pytest.mark.parametrize("xcds", [8, 6])
def test_die_order_is_a_permutation_of_contiguous_runs(total, xcds):
    """``_xcd_order``: every program runs once, and the programs that the dispatcher deals to
    one die (slots ``d, d + XCDS, ...``) are consecutive, in order: the row tiles of one block of
    markov_w2 share that die's L2. Totals that are multiples of the dies and that are not."""
    block = triton.next_power_of_2(total)
    out = torch.full((block,), -1, dtype=torch.int32)
    _xcd_kernel[(1,)](out, total, XCDS=xcds, BLOCK=block)
    got = out[:total].long()
    assert torch.equal(got.sort().values, torch.arange(total))
    for die in range(xcds):
        run = got[die::xcds]
        assert torch.equal(run, torch.arange(len(run)) + (run[0] if len(run) else 0))
    starts = [int(got[d]) for d in range(min(xcds, total))]
    assert starts == sorted(starts)  # die d's run before die d + 1's


def test_fast_noise_takes_the_exact_winner():
    """Two live tokens with equal logits, in different vocabulary blocks, whose fast noises
    order them the other way round than vLLM's noise (found by search): the fused path with the
    fast noise must still sample vLLM's token for that row, and every other row too; the last
    row, made the first one's twin (its request, position and previous token), as well."""
    vocab, rows = 20000, 20
    cfg = F._config(rows, vocab, 64, True)
    assert cfg["FAST_LOG"] == "log2"
    spec, hidden = R.make_case(
        vocab=vocab, rows=rows, n_spec=1, temps=(1.0,), inert=0.0, seed=81, adversarial=False
    )
    from noise_pairs import swapped_pair

    found = swapped_pair(spec, vocab, cfg["BV"], cfg["FAST_LOG"])
    assert found, "no swapped pair in this row: pick another seed"
    a, b, vllm_token = found
    w2 = spec.model.model.markov_head.markov_w2.weight.data
    w2[b] = w2[a]
    spec.model.base[:] = float("-inf")
    spec.model.base[:, a] = spec.model.base[:, b] = 1.0
    for t in (spec.sample_idx_mapping, spec.sample_pos):
        t[rows - 1] = t[0]
    ids, anchor = spec.input_buffers.input_ids, spec._anchor_idx
    ids[anchor[rows - 1]] = ids[anchor[0]]
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential)
    assert took
    assert int(ref["tokens"][0, 0]) == vllm_token  # the search keyed the noise as vLLM does
    assert int(ref["tokens"][rows - 1, 0]) == vllm_token
    assert torch.equal(out["tokens"][:rows], ref["tokens"][:rows])


# --- the reasons to decline --------------------------------------------------------------------


class _Spy:
    """Stands in for a kernel: records a launch instead of running it (or then runs ``kernel``)."""

    def __init__(self, kernel=None):
        self.launches, self.kernel = 0, kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
            if self.kernel is not None:
                self.kernel[grid](*args, **kwargs)

        return launch


def _install_spy(monkeypatch) -> _Spy:
    s = _Spy()
    for name in ("_markov_step_kernel", "_markov_verify_kernel", "_markov_last_kernel"):
        monkeypatch.setattr(K, name, s)
    return s


@pytest.fixture
def spy(monkeypatch):
    return _install_spy(monkeypatch)


def _base_case(**kw):
    kw.setdefault("vocab", 300)
    kw.setdefault("rows", 3)
    kw.setdefault("n_spec", 2)
    kw.setdefault("max_num_reqs", 4)
    return R.make_case(**kw)


def _nonbf16(spec):
    spec.model.model.markov_head.markov_w2.weight.data = (
        spec.model.model.markov_head.markov_w2.weight.data.half()
    )


def _noncontig(spec):
    w = spec.model.model.markov_head.markov_w2.weight
    w.data = w.data.t().contiguous().t()


def _cache_layout(spec):
    c = spec.draft_logits
    spec.draft_logits = torch.zeros(c.shape[2], c.shape[1], c.shape[0], dtype=c.dtype).permute(
        2, 1, 0
    )


class _OtherQuant:
    pass


def _w1(spec):
    return spec.model.model.markov_head.markov_w1.weight


def _w2(spec):
    return spec.model.model.markov_head.markov_w2.weight


def _other_processor(spec):
    lp = copy.copy(spec.model.logits_processor)
    lp.__class__ = type("OtherProcessor", (type(lp),), {})
    spec.model.logits_processor = lp


def _rank(spec, rank):
    for w in (_w1(spec), _w2(spec)):
        w.data = w.data[:, :rank].contiguous()


# (the reason _why_not gives, how a case gets it); a reason may come several ways.
REASONS = [
    ("no Markov head", lambda s: setattr(s.model.model, "markov_head", torch.nn.Linear(2, 2))),
    ("the draft top-k path", lambda s: setattr(s, "_draft_topk", 8)),
    ("a draft watermarker", lambda s: setattr(s, "draft_watermarker", object())),
    ("a reduced draft vocabulary", lambda s: setattr(s, "_d2t_scatter_index", torch.arange(3))),
    ("the confidence head", lambda s: setattr(s, "use_confidence_head", True)),
    ("the acceptance estimator", lambda s: setattr(s, "acceptance_estimator", object())),
    ("an output logit transform", lambda s: setattr(
        s.model, "apply_output_logit_transform", lambda x: x
    )),
    ("a logits soft cap", lambda s: setattr(s.model.logits_processor, "soft_cap", 30.0)),
    ("a logits scale", lambda s: setattr(s.model.logits_processor, "scale", 0.5)),
    ("a torch.float32 head dtype", lambda s: setattr(
        s.model.logits_processor, "head_dtype", torch.float32
    )),
    ("a logits processor the kernel does not mirror", lambda s: setattr(
        s.model.logits_processor, "logits_as_input", True
    )),
    ("a logits processor the kernel does not mirror", _other_processor),
    ("a logits processor the kernel does not mirror", lambda s: setattr(
        s.model, "logits_processor", None
    )),
    ("a quantized Markov head", lambda s: setattr(
        s.model.model.markov_head.markov_w2, "quant_method", _OtherQuant()
    )),
    ("a vocab-parallel Markov head", lambda s: setattr(
        s.model.model.markov_head.markov_w2, "tp_size", 2
    )),
    ("Markov weights not bf16", _nonbf16),
    ("Markov weights not bf16", lambda s: setattr(_w1(s), "data", _w1(s).data.half())),
    ("non-contiguous Markov weights", _noncontig),
    ("non-contiguous Markov weights", lambda s: setattr(
        _w1(s), "data", _w1(s).data.t().contiguous().t()
    )),
    ("Markov rank 32 (w2 32)", lambda s: _rank(s, 32)),
    ("Markov rank 64 (w2 128)", lambda s: setattr(
        _w2(s), "data", torch.cat([_w2(s).data] * 2, dim=1)
    )),
    ("a Markov embedding smaller than the vocabulary", lambda s: setattr(
        _w1(s), "data", _w1(s).data[:299].clone()
    )),
    ("a torch.float32 draft logits cache", lambda s: setattr(
        s, "draft_logits", s.draft_logits.float()
    )),
    ("a draft logits cache of another layout", _cache_layout),
    ("a draft logits cache of another layout", lambda s: setattr(
        s, "draft_logits", s.draft_logits[:, :1]
    )),
    ("a draft logits cache narrower than the vocabulary", lambda s: setattr(
        s, "draft_logits", s.draft_logits[:, :, :299]
    )),
    ("a sampling state of other dtypes", lambda s: setattr(
        s, "sample_idx_mapping", s.sample_idx_mapping.int()
    )),
    ("a sampling state of other dtypes", lambda s: setattr(s, "sample_pos", s.sample_pos.int())),
    ("a sampling state of other dtypes", lambda s: setattr(s, "seeds", s.seeds.int())),
    ("a sampling state of other dtypes", lambda s: setattr(s, "_anchor_idx", s._anchor_idx.int())),
    ("a sampling state of other dtypes", lambda s: setattr(
        s, "temperature", s.temperature.double()
    )),
    ("no draft steps", lambda s: setattr(s, "num_speculative_steps", 0)),
]  # fmt: skip


def _assert_declines(spec, hidden, rows, reason, spy, plugin_log):
    """The step takes vLLM's loop for ``reason``: sample_sequential returns False (twice),
    launches nothing, writes nothing, and the reason is logged once, at DEBUG."""
    assert F._why_not(spec, rows) == reason
    before = R.snapshot(spec)
    for _ in range(2):
        assert F.sample_sequential(spec, rows, hidden) is False
    assert spy.launches == 0
    after = R.snapshot(spec)
    assert torch.equal(before["tokens"], after["tokens"])
    if before["cache"] is not None:
        assert torch.equal(before["cache"], after["cache"])
    logged = [r for r in plugin_log.records if reason in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelname == "DEBUG"


@pytest.mark.parametrize("reason,make", REASONS, ids=[f"{i}" for i in range(len(REASONS))])
def test_declines(reason, make, spy, plugin_log):
    spec, hidden = _base_case(seed=61)
    make(spec)
    _assert_declines(spec, hidden, 3, reason, spy, plugin_log)


@pytest.mark.parametrize("invariant", [True, False])
def test_batch_invariant_mode_takes_vllms_loop(invariant, spy, plugin_log, monkeypatch):
    """Under VLLM_BATCH_INVARIANT vLLM's bias is its batch-invariant GEMM, and the fused tiles'
    summation order depends on the batch: the step declines; with the mode off it is taken."""
    from vllm import envs

    spec, hidden = _base_case(seed=64)
    monkeypatch.setattr(envs, "VLLM_BATCH_INVARIANT", invariant, raising=False)
    if invariant:
        _assert_declines(spec, hidden, 3, "vLLM's batch-invariant mode", spy, plugin_log)
    else:
        assert F._why_not(spec, 3) is None


def test_declines_reduced_vocabulary_of_greedy_model(spy, plugin_log):
    spec, hidden = _base_case(greedy=True, seed=62)
    spec.model.draft_id_to_target_id = torch.zeros(300, dtype=torch.long)
    _assert_declines(spec, hidden, 3, "a reduced draft vocabulary", spy, plugin_log)


def test_takes_a_bf16_head_dtype():
    """The other side of the head-dtype reason: bf16 (the Markov head's own) is taken."""
    spec, hidden = _base_case(seed=62)
    spec.model.logits_processor.head_dtype = torch.bfloat16
    assert F._why_not(spec, 3) is None


@pytest.mark.parametrize(
    "rows,ok", [(0, False), (1, True), (4, True), (5, False)]
)  # max_num_reqs = 4
def test_row_count_boundaries(rows, ok, spy, plugin_log):
    spec, hidden = _base_case(rows=3, seed=63)
    if ok:
        assert F._why_not(spec, rows) is None
    else:
        _assert_declines(spec, hidden, rows, f"{rows} requests", spy, plugin_log)


@pytest.mark.parametrize(
    "rank,ok", [(32, False), (64, True), (1024, True), (1088, False), (96, False)]
)
def test_rank_boundaries(rank, ok, monkeypatch, plugin_log):
    gen = torch.Generator().manual_seed(64)
    head = R.make_head(70, rank, "cpu", gen)
    spec, hidden = _base_case(vocab=70, rows=2, head=head, seed=64)
    if ok:
        took, ref, out = R.run_both(spec, 2, hidden, F.sample_sequential)
        assert took
        R.check_step(spec, 2, hidden, ref, out)
    else:
        reason = f"Markov rank {rank} (w2 {rank})"
        _assert_declines(spec, hidden, 2, reason, _install_spy(monkeypatch), plugin_log)


def test_embedding_larger_than_vocabulary_is_taken():
    """The other side of the embedding reason: more Markov embedding rows than tokens."""
    spec, hidden = _base_case(seed=65)
    _w1(spec).data = torch.cat([_w1(spec).data] * 2)
    assert F._why_not(spec, 3) is None


def test_draft_logits_cache_wider_than_the_vocabulary_is_taken():
    """The other side of the cache-width reason: a cache with columns past the vocabulary is
    taken, and those columns are left as they are (vLLM writes only the vocabulary's)."""
    spec, hidden = _base_case(seed=66)
    c = spec.draft_logits
    spec.draft_logits = torch.full((*c.shape[:2], c.shape[2] + 9), 3.0, dtype=c.dtype)
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential)
    assert took
    R.check_step(spec, 3, hidden, ref, out)
    assert (out["cache"][..., 300:] == 3.0).all()


def test_scratch_is_one_set_a_speculator_shape(monkeypatch):
    """Speculators of other max_num_reqs, steps or noise dtype get their own buffers, each as
    large as theirs (fp64 noise: the ping-pong keys too); the same shape shares them, so a graph
    keeps their addresses. The block-best columns cover the vocabulary in blocks of MIN_BV, the
    smallest block of every configuration; another GPU of the process has its own set."""
    monkeypatch.setattr(F, "_buffers", {})
    cpu = torch.device("cpu")
    four, _ = _base_case(seed=69, max_num_reqs=4)
    eight, _ = _base_case(seed=69, max_num_reqs=8)
    assert F._scratch(four, cpu, 300)["win"].shape == (four.num_speculative_steps, 4)
    assert F._scratch(eight, cpu, 300)["win"].shape == (eight.num_speculative_steps, 8)
    again, _ = _base_case(seed=70, max_num_reqs=4)
    assert F._scratch(again, cpu, 300)["win"] is F._scratch(four, cpu, 300)["win"]
    five, _ = _base_case(seed=69, n_spec=5)
    assert F._scratch(five, cpu, 300)["win"].shape == (5, 4)
    fp64, _ = _base_case(seed=69, fp64=True)
    assert [k.shape for k in F._scratch(fp64, cpu, 300)["keys"]] == [(4, 5)] * 2
    assert "keys" not in F._scratch(four, cpu, 300)
    assert F._scratch(four, cpu, 300)["bbest"].shape == (4, 5)  # 300 tokens: 5 blocks of 64
    assert min(c["BV"] for _, c in F.GPU_CONFIGS + F.GREEDY_GPU_CONFIGS) >= F.MIN_BV
    assert F._key(four, torch.device("cuda", 0), 300) != F._key(four, torch.device("cuda", 1), 300)


def test_launch_keys_tell_configurations_apart():
    """A launch configuration's key (compiled, compared with vLLM's loop, broken) names the
    device type, the vocabulary, the draft steps, the rank, greedy or sampled drafts, the
    noise dtype and the speculator's rows (the winners' row stride) besides the block sizes: a
    configuration compared or broken for one speculator says nothing of one that differs only
    there (under the interpreter all of these share their block sizes at 3 rows)."""
    cpu = torch.device("cpu")

    def key(device=cpu, **kw):
        spec, _ = _base_case(seed=72, **kw)
        return F._launch_key(spec, 3, device)[0]

    rank128 = R.make_head(300, 128, "cpu", torch.Generator().manual_seed(72))
    keys = [key(), key(greedy=True), key(fp64=True), key(head=rank128), key(vocab=280)]
    keys.append(key(n_spec=3))
    keys.append(key(torch.device("cuda", 0)))
    keys.append(key(max_num_reqs=8))
    assert len(set(keys)) == len(keys) and key() == keys[0]


def test_launch_keys_name_the_last_launchs_tile():
    """The last launch takes the batch's next power of two rows a program, up to 64: a batch
    under one step configuration but another last tile compiles another last kernel, so its key
    differs and it is compared on its own (sampled drafts from 17 rows up: one step
    configuration, last tiles 32 and 64)."""
    cuda = torch.device("cuda", 0)
    spec, _ = _base_case(seed=74, max_num_reqs=256)

    def key(rows):
        return F._launch_key(spec, rows, cuda)

    assert key(17)[1] == key(33)[1] == key(256)[1]
    assert key(17)[0] == key(32)[0] != key(33)[0] == key(256)[0]


def test_launch_configuration_follows_the_draft_method():
    """On a GPU a greedy speculator's steps launch with ``GREEDY_GPU_CONFIGS`` (64-row tiles at
    64 rows), a sampled one's with ``GPU_CONFIGS`` (32-row tiles): ``_launch_key`` picks the
    table by the speculator's drafts. Under the interpreter both share their block sizes, so
    the step tests cannot tell (a greedy step on the sampled table gives the same tokens,
    slower)."""
    cuda = torch.device("cuda", 0)
    greedy, _ = _base_case(seed=73, greedy=True, max_num_reqs=64)
    sampled, _ = _base_case(seed=73, max_num_reqs=64)
    assert F._launch_key(greedy, 64, cuda)[1]["R_TILE"] == 64
    assert F._launch_key(sampled, 64, cuda)[1]["R_TILE"] == 32


@pytest.mark.parametrize("hip", [None, "6.3.42131"], ids=["cuda", "rocm"])
def test_gpu_configuration_of_a_batch(hip, monkeypatch):
    """``_config`` off the interpreter: sampled drafts take the table's first entry up to 16
    rows (vLLM's exact noise, two blocks a program) and the fast noise from 17 rows, whose log is
    the backend's ("log2" on ROCm, "ptx" on CUDA); greedy drafts 64-row tiles up to 64 rows, then
    128-row tiles; a tile never under the dot's 16 rows, folded to the batch (``R_EPI``); the
    dies' program order on ROCm only; an ``over`` entry (bench_markov.py --sweep) replaces the
    table's, its BK cut to a power of 2 that divides the rank."""
    monkeypatch.setattr(torch.version, "hip", hip)

    def cfg(rows, greedy=False, rank=256, over=None):
        c = F._config(rows, 129280, rank, False, over=over, greedy=greedy)
        return c, (c["R_TILE"], c["R_EPI"], c["BLOCKS"], c["FAST_LOG"])

    assert cfg(16)[1] == (16, 16, 2, "")
    assert cfg(17)[1] == (32, 32, 1, "log2" if hip else "ptx")
    assert cfg(3)[1] == (16, 4, 2, "")
    assert cfg(20, greedy=True)[1] == (32, 32, 1, "")
    assert cfg(64, greedy=True)[1] == (64, 64, 1, "")
    assert cfg(65, greedy=True)[1] == (128, 128, 1, "")
    assert {cfg(rows)[0]["XCDS"] for rows in (1, 17, 256)} == {F.GFX942_XCDS if hip else 1}
    assert cfg(256, over=dict(BV=64))[0]["BV"] == 64
    assert cfg(256, rank=192, over=dict(BK=128))[0]["BK"] == 64


def test_no_memory_for_the_scratch_takes_vllms_loop_this_step(
    monkeypatch, spy, plugin_log, clean_plugin
):
    """Allocating the scratch runs out of memory: this step is vLLM's (the same tokens and
    cache), warned once as any fused step out of memory is, nothing launched, no configuration
    marked broken, and counted as vLLM's loop; the next step, with memory, is fused, and counted
    as taken."""
    from dsv41_gfx942_plugin._log import MARKOV_OUT_OF_MEMORY

    spec, hidden = _base_case(seed=71)
    monkeypatch.setattr(F, "_buffers", {})
    real, failed = F._scratch, []

    def scratch(*args):
        if not failed:
            failed.append(1)
            raise torch.OutOfMemoryError("no memory")
        return real(*args)

    monkeypatch.setattr(F, "_scratch", scratch)
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential, fused_only=False)
    assert took and spy.launches == 0 and F._broken == set() and F._buffers == {}
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])
    why = "no memory for the fused path's scratch"
    assert [r.levelname for r in plugin_log.records if why in r.getMessage()] == ["DEBUG"]
    warned = [r.getMessage() for r in plugin_log.records if r.levelname == "WARNING"]
    assert warned.count(MARKOV_OUT_OF_MEMORY) == 1
    loop = {"vLLM's loop from the base logits (out of memory)": 1}
    assert clean_plugin.stats()["fused_markov"] == {"taken": 0, "declined": 1, "reasons": loop}
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential)
    assert took and spy.launches == spec.num_speculative_steps + 1
    assert clean_plugin.stats()["fused_markov"]["taken"] == 1
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])


def test_capture_needs_the_scratch_allocated_before(monkeypatch):
    """A CUDA graph capture before the speculator's scratch exists is declined (the graph would
    keep addresses of buffers allocated inside it); once allocated, or outside capture, not."""
    spec, _ = _base_case(seed=67)
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(F, "_buffers", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert F._capturing_cold(spec, cuda, 300)
    assert not F._capturing_cold(spec, torch.device("cpu"), 300)
    F._buffers[F._key(spec, cuda, 300)] = {}
    assert not F._capturing_cold(spec, cuda, 300)
    assert F._capturing_cold(spec, cuda, 301)  # another vocabulary: other buffers
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert not F._capturing_cold(spec, cuda, 301)


@pytest.mark.parametrize(
    "cold,reason",
    [
        (True, "scratch not allocated before CUDA graph capture"),
        (False, "not yet compared with vLLM's loop (inside CUDA graph capture)"),
    ],
)
def test_declines_inside_capture(cold, reason, spy, plugin_log, monkeypatch):
    """``_why_not`` asks both capture questions (each tested alone above and in
    test_markov_check; faked here, the CPU has no capture) of the step's device, vocabulary and
    batch, the scratch's first, and the step declines with the reason of the first that holds."""
    spec, hidden = _base_case(seed=68)
    asked = []
    monkeypatch.setattr(
        F, "_capturing_cold", lambda s, d, v: asked.append(("cold", s, d, v)) or cold
    )
    monkeypatch.setattr(
        F, "_capturing_unchecked", lambda s, n, d: asked.append(("unchecked", s, n, d)) or True
    )
    _assert_declines(spec, hidden, 3, reason, spy, plugin_log)
    cpu = _w2(spec).device
    assert asked[0] == ("cold", spec, cpu, 300)
    assert asked[1] == (("cold", spec, cpu, 300) if cold else ("unchecked", spec, 3, cpu))


def test_cpu_without_interpreter(spy, plugin_log, monkeypatch):
    spec, hidden = _base_case(seed=67)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reason = "CPU tensors without the Triton interpreter"
    _assert_declines(spec, hidden, 3, reason, spy, plugin_log)


def _width(n):
    """Base logits of the vocabulary's width plus ``n`` columns (an LM head's padded output)."""
    return lambda x: torch.cat([x, x[:, :n]], 1) if n > 0 else x[:, : x.shape[1] + n].contiguous()


# (how the base logits are made from the vocabulary's, whether vLLM's add raises, kernel takes)
BASE_LOGITS = [
    (lambda x: x.t().contiguous().t(), False, False),  # strided along the vocabulary
    (_width(-1), True, False),
    (_width(1), True, False),
    (_width(20), True, False),  # markov_w2's rows (ParallelLMHead pads 300 to 320)
    (_width(0), False, True),
    (lambda x: x.float(), True, False),  # fp32: vLLM's cache store asserts bf16
]


@pytest.mark.parametrize(
    "make,raises,kernel", BASE_LOGITS, ids=["strided", "299", "301", "320", "300", "fp32"]
)
def test_base_logits_the_kernel_cannot_take_run_vllms_loop_once(make, raises, kernel, spy):
    """Base logits strided along the vocabulary, of another dtype than the bf16 the kernel adds
    to (vLLM's cache store asserts), or of another width than the Markov bias (vLLM's add
    raises): vLLM's loop from those logits, computed once, so the same tokens or the same error;
    the bias's own width (the other side) is the kernel's."""
    spec, hidden = _base_case(seed=68)
    assert _w2(spec).shape[0] == 320 and spec.model.logits_processor.org_vocab_size == 300
    calls = []
    compute = spec.model.compute_draft_logits
    spec.model.compute_draft_logits = lambda h: calls.append(1) or make(compute(h))
    start = R.snapshot(spec)

    def run(fn):
        R._restore(spec, start)
        calls.clear()
        try:
            done = fn(spec, 3, hidden)
        except (RuntimeError, AssertionError) as e:
            done = str(e)
        return done, R.snapshot(spec), calls == [1]

    ref_done, ref, _ = run(R.vllm_sample_sequential())
    done, out, once = run(F.sample_sequential)
    assert once and isinstance(ref_done, str) == raises
    if kernel:
        assert done is True and spy.launches == spec.num_speculative_steps + 1
        return
    assert spy.launches == 0 and done == (ref_done or True)
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])


def test_base_logits_past_the_rocm_limit_run_vllms_loop(spy, monkeypatch, clean_plugin):
    """On ROCm, base logits whose storage passes BASE_BYTES (2**31 - 1: Triton compiles the
    kernel for 32-bit buffer loads up to it, otherwise past it) take vLLM's loop from those
    logits, so that no batch runs a compiled variant the comparison did not; at the limit the
    launches serve. Here the limit is set about this step's base logits."""
    spec, hidden = _base_case(seed=75)
    sizes = []
    compute = spec.model.compute_draft_logits

    def sized(h):
        base = compute(h)
        sizes.append(base.untyped_storage().nbytes())
        return base

    spec.model.compute_draft_logits = sized
    fused = spec.num_speculative_steps + 1
    for over, launches in ((None, fused), (1, 0), (0, fused)):  # the first (CUDA) sizes them
        monkeypatch.setattr(F, "BASE_BYTES", over if over is None else sizes[0] - over)
        spy.launches = 0
        took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential, fused_only=False)
        assert took and spy.launches == launches and len(set(sizes)) == 1
        if not launches:  # vLLM's loop ran (the spy stands in for the kernels)
            assert torch.equal(ref["tokens"], out["tokens"])
            assert torch.equal(ref["cache"], out["cache"])
    loop = {"vLLM's loop from the base logits (base logits past 2 GiB)": 1}
    assert clean_plugin.stats()["fused_markov"] == {"taken": 2, "declined": 1, "reasons": loop}


def _out_of_shared_memory():
    from triton.runtime.errors import OutOfResources

    return OutOfResources(303104, 232448, "shared memory")


@pytest.mark.parametrize(
    "error",
    [_out_of_shared_memory, lambda: RuntimeError("PassManager::run failed")],
    ids=["out-of-resources", "backend-pass"],
)
def test_a_launch_that_does_not_compile_takes_vllms_loop(monkeypatch, error):
    """A compile failure at the second step's first launch: out of shared memory (as a 64-row
    tile was on the H200) or a RuntimeError from the compiler backend's passes (Triton 3.6 on
    the H200, a layout it could not verify). This step takes vLLM's loop from its base logits,
    the scratch is clean, and later steps of that configuration take vLLM's loop without
    launching."""
    spec, hidden = _base_case(seed=69)
    real = K._markov_step_kernel

    class FailSecond:
        launches = 0

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                FailSecond.launches += 1
                if FailSecond.launches == 2:
                    raise error()
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(K, "_markov_step_kernel", FailSecond())
    cleared = []  # the HIP last error a failed launch may leave, reset before vLLM's loop
    monkeypatch.setattr(F._launcher, "clear_last_error", lambda: cleared.append(1) or 0)
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential, fused_only=False)
    assert took and FailSecond.launches == 2 and cleared == [1]
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])
    assert (F._scratch(spec, spec.device, 300)["win"] == -(2**63)).all()
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential, fused_only=False)
    assert took and FailSecond.launches == 2
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])


# The noises of the two tokens that ``_skewed_noise32`` moves (set by the test that patches it).
_SKEW_DOWN = float("nan")
_SKEW_UP = float("nan")


@triton.jit
def _skewed_noise32(u, FAST_LOG: tl.constexpr):
    """vLLM's noise, and as the fast noise vLLM's moved by 0.9 ``FAST_NOISE_ERR`` at two tokens
    (down at the one whose exact noise is ``_SKEW_DOWN``, up at ``_SKEW_UP``): a fast noise
    within the bound that the verify launch is written for."""
    exact = M._noise32(u, "")
    if FAST_LOG == "":
        return exact
    off = 0.9 * M.FAST_NOISE_ERR
    up = tl.where(exact == _SKEW_UP, exact + off, exact)
    return tl.where(exact == _SKEW_DOWN, exact - off, up)


def test_fast_noise_anywhere_within_its_bound_takes_the_exact_winner(monkeypatch):
    """The verify launch's contract: whatever the fast noise, within ``FAST_NOISE_ERR`` of vLLM's,
    the token is vLLM's. A token whose exact value is the row's best can trail the fast best by
    up to twice the bound, so the verify recomputes every block whose fast best comes within
    ``2 * delta``. The interpreter's fast noise (numpy's log2) is far closer to vLLM's than the
    bound, so no natural case tells a window of one bound from two, nor a bound cut far below
    what the GPU's log needs: here the fast noise is vLLM's, moved down by 0.9 of the bound at
    token ``a`` (last vocabulary block) and up at token ``b`` (an earlier block), whose exact
    values ``a`` leads by 0.2-0.6 of the bound (logits chosen for it; the Markov weights zero,
    every other token -inf). The fast best is then ``b``'s, ``a``'s block trails it by 1.2-1.6
    bounds, and only the exact recomputation of ``a``'s block (the last) gives vLLM's token."""
    from noise_pairs import row_noises

    monkeypatch.setattr(F, "BV_INTERP", 1024)
    vocab, rows = 4096, 17
    cfg = F._config(rows, vocab, 64, True)
    assert cfg["FAST_LOG"] == "log2" and -(-vocab // cfg["BV"]) == 4
    spec, hidden = R.make_case(
        vocab=vocab, rows=rows, n_spec=1, temps=(1.0,), inert=0.0, seed=99, adversarial=False
    )
    # Row 0 served by request slot 0, the live request a "> 0" test would take for inert.
    idx = spec.sample_idx_mapping
    idx[idx == 0], idx[0] = idx[0].item(), 0
    _w2(spec).data.zero_()
    exact = row_noises(spec, 0, vocab)[0]
    delta = M.FAST_NOISE_ERR.value
    a = 3 * 1024 + int(exact[3 * 1024 :].argmax())  # token a: the last block, logit 0
    found = None
    for b in range(3 * 1024):
        lb = (exact[a] - exact[b] - 0.4 * delta).to(torch.bfloat16)
        gap = float(exact[a] - (lb.float() + exact[b]))  # fp32, as both kernels add
        unique = int((exact == exact[b]).sum()) == 1
        if 0.2 * delta <= gap <= 0.6 * delta and unique and abs(float(lb)) < 8:
            found = b, lb
            break
    assert found is not None and int((exact == exact[a]).sum()) == 1
    b, lb = found
    spec.model.base[:] = float("-inf")
    spec.model.base[:, a] = 0.0
    spec.model.base[:, b] = lb
    monkeypatch.setitem(globals(), "_SKEW_DOWN", float(exact[a]))
    monkeypatch.setitem(globals(), "_SKEW_UP", float(exact[b]))
    monkeypatch.setattr(K, "_noise32", _skewed_noise32)
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential)
    assert took
    assert int(ref["tokens"][0, 0]) == a  # vLLM's winner of row 0
    assert torch.equal(out["tokens"][:rows], ref["tokens"][:rows])


def test_fast_noise_rounding_within_its_relative_slack(monkeypatch):
    """The verify window's relative part (``FAST_NOISE_REL``): where ``logits / temp`` is large,
    a fast noise within its bound can move ``y``'s fp32 rounding by a whole ulp, far more than the
    bound. Temperature 2**-20 and logit 1 put ``y`` at about 2**20 (an ulp of 1/16 or 1/8); tokens
    ``a`` (last vocabulary block) and ``b`` (an earlier one) are chosen so that vLLM's ``y`` of
    ``a`` is one ulp above ``b``'s while the fast noises, skewed by 0.9 of the bound as in the test
    above, round ``a`` down and ``b`` up: ``a``'s block then trails the fast best by an ulp (64 or
    128 bounds), and only the relative slack brings it into the verify window (with the bound
    alone, ``FAST_NOISE_REL`` 0, this fails)."""
    from noise_pairs import row_noises

    monkeypatch.setattr(F, "BV_INTERP", 1024)
    vocab, rows, temp = 4096, 17, 2.0**-20
    assert F._config(rows, vocab, 64, True)["FAST_LOG"] == "log2"
    spec, hidden = R.make_case(
        vocab=vocab, rows=rows, n_spec=1, temps=(temp,), inert=0.0, seed=99, adversarial=False
    )
    _w2(spec).data.zero_()
    off, err = 0.9 * M.FAST_NOISE_ERR.value, M.FAST_NOISE_ERR.value
    for row in range(rows):  # the first row with such a pair
        g = row_noises(spec, row, vocab)[0]
        y0 = torch.tensor(1.0 / temp)  # fp32 sums, as both kernels add
        exact, down, up = y0 + g, y0 + (g - off), y0 + (g + off)
        ga, gb = slice(3 * 1024, vocab), slice(0, 3 * 1024)
        pair = (exact[ga][:, None] > exact[gb][None, :]) & (
            up[gb][None, :] - down[ga][:, None] > 2 * err
        )
        unique = torch.unique(g, return_counts=True)[1].max() == 1  # the skew keys by value
        if pair.any() and unique:
            i, j = (int(x) for x in pair.nonzero()[0])
            a, b = 3 * 1024 + i, j
            break
    else:
        pytest.fail("no row with such a pair: pick another seed")
    spec.model.base[:] = float("-inf")
    spec.model.base[:, a] = spec.model.base[:, b] = 1.0
    monkeypatch.setitem(globals(), "_SKEW_DOWN", float(g[a]))
    monkeypatch.setitem(globals(), "_SKEW_UP", float(g[b]))
    monkeypatch.setattr(K, "_noise32", _skewed_noise32)
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential)
    assert took
    assert int(ref["tokens"][row, 0]) == a  # vLLM's winner of that row
    assert torch.equal(out["tokens"][:rows], ref["tokens"][:rows])


@pytest.mark.parametrize(("rows", "fp64"), [(3, False), (17, False), (3, True)])
def test_logits_divided_by_the_temperature_as_vllm_does(rows, fp64):
    """``logits / temp`` rounds otherwise than ``logits * (1 / temp)`` for some logits, and a
    last-bit difference of ``y`` decides a near tie: two tokens whose winner at temperature 0.3
    differs between the two (logits from the bf16 values in [1, 2), found by search over the
    first row's noise; every other token -inf, the Markov weights zero) must sample vLLM's
    token. 3 rows take the exact noise in the step kernel, 17 the verify launch's recomputation
    (the reciprocal in either kernel fails this). With fp64 noise vLLM divides in fp32, then
    widens: the pair's winner differs from an fp64 division's (which fails it)."""
    from noise_pairs import row_noises, row_noises64

    vocab, temp = 4096, torch.tensor(0.3)
    case = dict(vocab=vocab, rows=rows, n_spec=1, temps=(0.3,), inert=0.0, seed=99)
    spec, hidden = R.make_case(**case, fp64=fp64, adversarial=False)
    _w2(spec).data.zero_()
    g = row_noises64(spec, 0, vocab) if fp64 else row_noises(spec, 0, vocab)[0]
    bf16 = torch.arange(0x3F80, 0x4000, dtype=torch.int16).view(torch.bfloat16).float()
    col = torch.arange(vocab)

    def beats(la, lb, scale):  # [a, b]: token b (logit lb) beats token a (logit la)
        ya, yb = scale(la) + g, scale(lb) + g
        return (yb[None, :] > ya[:, None]) | ((yb[None, :] == ya[:, None]) & (col < col[:, None]))

    vllms = lambda x: (x / temp).to(g.dtype)  # noqa: E731
    other = (lambda x: x.double() / temp.double()) if fp64 else (lambda x: x * (1.0 / temp))
    found = None
    for la in bf16[vllms(bf16) != other(bf16)]:
        for lb in bf16:
            flip = beats(la, lb, vllms) != beats(la, lb, other)
            flip.fill_diagonal_(False)
            if flip.any():
                found = float(la), float(lb), *(int(x) for x in flip.nonzero()[0])
                break
        if found:
            break
    assert found, "no such pair in this row: pick another seed"
    la, lb, a, b = found
    spec.model.base[:] = float("-inf")
    spec.model.base[:, a], spec.model.base[:, b] = la, lb
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential)
    assert took
    assert int(ref["tokens"][0, 0]) in (a, b)
    assert torch.equal(out["tokens"][:rows], ref["tokens"][:rows])


@triton.jit
def _noise_errors(out_ptr, bits_ptr, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    u = tl.load(bits_ptr + at).to(tl.float32, bitcast=True)
    exact, fast = M._noise32(u, ""), M._noise32(u, FAST_LOG)
    finite = (tl.abs(exact) < float("inf")) & (tl.abs(fast) < float("inf"))
    tl.store(out_ptr + at, tl.where(finite, tl.abs(fast - exact), float("inf")))


def test_fast_noise_formula_within_its_bound():
    """The fast noise's formula (``_noise32``: the series below ``FAST_SERIES_MAX``, the log of
    ``1 - u`` above) against vLLM's noise in the interpreter, whose log is numpy's: finite and
    within a quarter of ``FAST_NOISE_ERR`` (as the GPU test demands of the GPU's log) over fp32
    uniforms spread evenly in bits over [2**-33, 1] plus the 64 fp32 on each side of the
    series' threshold. The end-to-end cases cannot see a wrong formula: their vocabularies are
    mostly one interpreter block, which the verify launch recomputes with vLLM's noise whatever
    the fast noise was."""
    low, one = (127 - 33) << 23, 0x3F800000  # the bits of 2**-33 and of 1.0
    series_max = torch.tensor(M.FAST_SERIES_MAX.value, dtype=torch.float32).view(torch.int32)
    bits = torch.cat(
        [
            torch.linspace(low, one, 1 << 16, dtype=torch.float64).round().to(torch.int32),
            int(series_max) + torch.arange(-64, 64, dtype=torch.int32),
        ]
    )
    err = torch.empty(bits.numel(), dtype=torch.float32)
    _noise_errors[(bits.numel() // 128,)](err, bits, "log2", 128)
    assert err.max().item() <= M.FAST_NOISE_ERR.value / 4, err.max().item()


def test_nan_logits_never_win_fp64_noise(monkeypatch):
    """As ``test_nan_logits``'s sampled half, with fp64 noise (``use_fp64_gumbel``), whose winners
    go through ``_order64`` keys and the block-best scan instead of ``_first_max``: a NaN logit
    never wins (vLLM's Gumbel kernel drops it under the interpreter), also at a column before
    the row's best, over two vocabulary blocks; the cache holds the NaNs as vLLM's."""
    monkeypatch.setattr(F, "BV_INTERP", 512)
    spec, hidden = R.make_case(vocab=800, rows=4, n_spec=3, fp64=True, inert=0.0, seed=52)
    spec.model.base[:, 77] = float("nan")
    spec.model.base[:, 600] = float("nan")
    took, ref, out = R.run_both(spec, 4, hidden, F.sample_sequential)
    assert took
    assert not torch.isin(ref["tokens"][:4], torch.tensor([77, 600])).any()
    assert torch.equal(out["tokens"][:4], ref["tokens"][:4])
    R.check_step(spec, 4, hidden, ref, out)
