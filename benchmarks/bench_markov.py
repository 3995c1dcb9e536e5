"""DSpark Markov draft sampling: the plugin's fused launches vs vLLM 0.33.0's loop, one run.

For each row count, 5 draft steps over DSv4.1's vocabulary (129280) and Markov rank (256),
probabilistic drafts (fp32 Gumbel noise, temperature 1, every row live), it times

- fused: ``fused_markov._launch`` (one launch a step plus one; from 17 sampled rows a verify
  launch a step too), eager and in a CUDA graph;
- vLLM: vLLM's loop with the draft model's hooks written out (embedding, bf16 ``F.linear``, add,
  vLLM's own Triton ``gumbel_sample``, token store: ``tests/ref_markov.transcribed_loop``), eager
  and graphed; where vLLM cannot be imported, the same op sequence with torch's Gumbel noise;

- in-tree: vLLM 0.33.0's own gfx942 fused sampling (``--monokernel``; ``_markov_in_tree.py``),
  graphed, where it takes the step (sampled drafts of at most 8 rows), with whether its tokens
  equal the plugin's;

and prints each beside the memory floor: every step reads ``markov_w2`` once (66 MB) and each
row's base logits, and writes each row's cached logits (2 x 0.26 MB a row), at the GPU's peak
bandwidth (``HBM_TBPS``: 4.8 TB/s on an H200; ``--hbm-tbps`` to name another; in the JSON);
and beside three measured references (``_markov_floors.py``, graphed): ``stream``, the same
bytes moved by torch's kernels with no arithmetic (not a lower bound: torch's reduction falls
short of the bandwidth, and the fused step beats it up to 64 rows on the H200 and H100),
``noise``, vLLM's exact Gumbel noise and a row argmax alone, and ``fast``, the same with the
fast noise that sampled batches above 16 rows draw; ``/noise`` divides the fused time by the one
of the two its configuration draws (``FAST_LOG``).
Times are the mean of ``--iters`` calls after warm-up, measured with CUDA events. Writes JSON.

    python benchmarks/bench_markov.py --json out.json [--rows 1,8,32,64,128,256] [--greedy]

``--greedy`` times greedy drafts instead (vLLM's default ``draft_sample_method``: argmax, no
noise, no logits cache): the floor then leaves the cache's write out, and the measured
references are not taken.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import types

import torch
import torch.nn.functional as TF
from triton.runtime.errors import OutOfResources

from _timing import graphed, mean_us, require_gpu, summary, use_checkout

use_checkout()

if importlib.util.find_spec("vllm._C") is None:
    # vLLM's Python files without its compiled parts (the H200): keep vLLM off its CUDA platform.
    import vllm.platforms as _platforms
    from vllm.platforms.interface import UnspecifiedPlatform

    _platforms._current_platform = UnspecifiedPlatform()

import _markov_floors as floors  # noqa: E402
import _markov_in_tree as in_tree  # noqa: E402
from dsv41_gfx942_plugin.ops import fused_markov as F  # noqa: E402

# Peak HBM bandwidth (TB/s) by a part of the device's name, the first that matches: the floor's
# divisor (vendors' datasheet figures); --hbm-tbps overrides. A GPU not listed stops the run
# rather than take another's figure (the floor was 4.8 TB/s, the H200's, on every GPU).
HBM_TBPS = {"H200": 4.8, "H100 PCIe": 2.0, "H100 NVL": 3.9, "H100": 3.35, "MI325X": 6.0,
            "MI300X": 5.3}  # fmt: skip


def hbm_bytes_per_s(override: float | None) -> float | None:
    """The floor's bandwidth in bytes/s: ``override`` TB/s, else this GPU's from HBM_TBPS."""
    if override:
        return override * 1e12
    name = torch.cuda.get_device_name()
    for key, tbps in HBM_TBPS.items():
        if key in name:
            return tbps * 1e12
    return None


def make_state(rows: int, vocab: int, rank: int, n_spec: int, device="cuda", greedy=False):
    """The state the loop reads: every row live, temperature 1, fp32 noise (a greedy draft: no
    logits cache)."""
    gen = torch.Generator(device=device).manual_seed(rows)
    max_reqs = max(rows, 4)
    bf = dict(dtype=torch.bfloat16, device=device)
    w1 = (torch.randn(vocab, rank, generator=gen, device=device) * 0.2).to(torch.bfloat16)
    w2 = torch.randn((vocab + 63) // 64 * 64, rank, generator=gen, device=device) * 0.2
    base = (torch.randn(rows * n_spec, vocab, generator=gen, device=device) * 3).to(**bf)
    spec = types.SimpleNamespace(
        num_speculative_steps=n_spec,
        max_num_reqs=max_reqs,
        use_fp64_gumbel=False,
        draft_logits=None if greedy else torch.zeros(max_reqs, n_spec, vocab, **bf),
        temperature=torch.ones(max_reqs, dtype=torch.float32, device=device),
        seeds=torch.randint(0, 2**62, (max_reqs,), generator=gen, device=device),
        draft_tokens=torch.zeros(max_reqs, n_spec, dtype=torch.int64, device=device),
        _step_cols=torch.arange(n_spec, dtype=torch.int32, device=device),
        _anchor_idx=torch.arange(max_reqs, device=device) * n_spec,
        input_buffers=types.SimpleNamespace(
            input_ids=torch.randint(0, vocab, (max_reqs * n_spec,), device=device).int()
        ),
        sample_idx_mapping=torch.arange(max_reqs, device=device).repeat_interleave(n_spec),
        sample_pos=torch.arange(max_reqs * n_spec, device=device) + 1000,
    )
    return spec, w1, w2.to(torch.bfloat16), base.view(rows, n_spec, vocab)


def _state(args, rows: int):
    return make_state(rows, args.vocab, args.rank, args.steps, greedy=args.greedy)


def _us(t, width: int) -> str:
    return f"{t:>{width}.1f}" if t is not None else f"{'-':>{width}}"


def _x(ratio, width: int) -> str:
    return f"{ratio:>{width}.2f}x" if ratio is not None else f"{'-':>{width + 1}}"


def _ratio(t, r: dict, width: int) -> str:
    """``t`` over the fused graphed time (how much faster the plugin is), or a dash."""
    return _x(t and t / r["fused_graph_us"], width)


def torch_loop(spec, rows, base3, w1, w2):
    """vLLM's loop with torch's Gumbel-max in place of vLLM's kernel (no vLLM needed)."""
    n_spec, vocab = base3.shape[1], base3.shape[2]
    idx = spec.sample_idx_mapping[: rows * n_spec].view(rows, n_spec)
    prev = spec.input_buffers.input_ids[spec._anchor_idx[:rows]]
    for i in range(n_spec):
        logits = base3[:, i] + TF.linear(TF.embedding(prev, w1), w2)[..., :vocab]
        if spec.draft_logits is None:
            token = logits.argmax(-1)
        else:
            spec.draft_logits[idx[:, i], i] = logits
            u = torch.rand(logits.shape, device=logits.device).clamp_(min=1e-10)
            noisy = logits.float() / spec.temperature[idx[:, i], None] - (-u.log()).log()
            token = noisy.argmax(-1)
        spec.draft_tokens[:rows, i] = token
        prev = token


def vllm_loop():
    try:
        from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample  # noqa: F401

        import ref_markov

        return "vLLM loop (vLLM's gumbel_sample)", ref_markov.transcribed_loop
    except Exception as e:  # vLLM not importable here
        print(f"vLLM's gumbel_sample unavailable ({e!r}): torch op sequence instead")
        return "torch op sequence", torch_loop


def floor_us(
    rows: int, vocab: int, rank: int, n_spec: int, greedy: bool, bytes_per_s: float
) -> float:
    per_step = (vocab + 63) // 64 * 64 * rank * 2 + rows * vocab * 2 * (1 if greedy else 2)
    return n_spec * per_step / bytes_per_s * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=summary(__doc__))
    ap.add_argument("--rows", default="1,8,32,64,128,256")
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default="bench_markov.json")
    ap.add_argument("--sweep", default="", help="row counts for which to time other configurations")
    ap.add_argument("--greedy", action="store_true", help="greedy drafts (argmax, no cache)")
    ap.add_argument("--hbm-tbps", type=float, default=None, help="peak HBM TB/s for the floor")
    args = ap.parse_args()
    require_gpu("bench_markov.py")
    bw = hbm_bytes_per_s(args.hbm_tbps)
    if bw is None:
        raise SystemExit(
            f"bench_markov.py: no peak bandwidth known for "
            f"{torch.cuda.get_device_name()}; pass --hbm-tbps"
        )
    name, loop = vllm_loop()
    results = []
    head = (
        f"{'rows':>5} {'fused eager':>12} {'fused graph':>12} {'vLLM eager':>11} {'vLLM graph':>11}"
    )
    kind = "greedy" if args.greedy else "probabilistic"
    print(f"baseline: {name}; {kind} drafts, times in us for {args.steps} steps, V={args.vocab}")
    print(
        head + f" {'floor':>7} {'stream':>7} {'noise':>7} {'fast':>7} {'graph/floor':>11}"
        f" {'/noise':>7}"
        f" {'vs vLLM graph':>13}"
        f" {'in-tree':>8} {'vs in-tree':>10}"
    )
    # The fast noise's log on this backend: what a large sampled batch's step kernel takes.
    fast_log = F._config(256, args.vocab, args.rank, False)["FAST_LOG"]
    for rows in (int(r) for r in args.rows.split(",")):
        spec, w1, w2, base3 = _state(args, rows)
        fused = functools.partial(F._launch, spec, rows, base3, w1, w2)
        ref = functools.partial(loop, spec, rows, base3, w1, w2)
        r = dict(rows=rows)
        r["fused_eager_us"] = mean_us(fused, args.iters)
        r["fused_graph_us"] = mean_us(graphed(fused), args.iters)
        r["vllm_eager_us"] = mean_us(ref, args.iters)
        r["vllm_graph_us"] = mean_us(graphed(ref), args.iters)
        r["floor_us"] = floor_us(rows, args.vocab, args.rank, args.steps, args.greedy, bw)
        r["config"] = F._config(rows, args.vocab, args.rank, False, greedy=args.greedy)
        r["stream_graph_us"] = r["noise_graph_us"] = r["fast_noise_graph_us"] = None
        r["fused_over_its_noise"] = None
        if not args.greedy:
            stream, noise = floors.stream(spec, rows, base3, w2), floors.noise(spec, rows, base3)
            r["stream_graph_us"] = mean_us(graphed(stream), args.iters)
            r["noise_graph_us"] = mean_us(graphed(noise), args.iters)
            fast = floors.noise(spec, rows, base3, fast_log)
            r["fast_noise_graph_us"] = mean_us(graphed(fast), args.iters)
            its = "fast_noise_graph_us" if r["config"]["FAST_LOG"] else "noise_graph_us"
            r["fused_over_its_noise"] = r["fused_graph_us"] / r[its]
        r["in_tree_graph_us"] = r["in_tree_same_tokens"] = None
        run_in_tree = in_tree.runner(spec, rows, base3, w1, w2)
        if run_in_tree is not None:
            fused()
            ours = spec.draft_tokens[:rows].clone()
            r["in_tree_graph_us"] = mean_us(graphed(run_in_tree), args.iters)
            r["in_tree_same_tokens"] = bool(torch.equal(spec.draft_tokens[:rows], ours))
        r["fused_graph_over_floor"] = r["fused_graph_us"] / r["floor_us"]
        r["speedup_vs_vllm_graph"] = r["vllm_graph_us"] / r["fused_graph_us"]
        results.append(r)
        print(
            f"{rows:>5} {r['fused_eager_us']:>12.1f} {r['fused_graph_us']:>12.1f}"
            f" {r['vllm_eager_us']:>11.1f} {r['vllm_graph_us']:>11.1f} {r['floor_us']:>7.1f}"
            f" {_us(r['stream_graph_us'], 7)} {_us(r['noise_graph_us'], 7)}"
            f" {_us(r['fast_noise_graph_us'], 7)}"
            f" {r['fused_graph_over_floor']:>10.2f}x"
            f" {_x(r['fused_over_its_noise'], 6)}"
            f" {r['speedup_vs_vllm_graph']:>12.2f}x"
            f" {_us(r['in_tree_graph_us'], 8)} {_ratio(r['in_tree_graph_us'], r, 9)}"
            f"{'' if r['in_tree_same_tokens'] in (None, True) else ' (other tokens)'}",
            flush=True,
        )
    out = dict(
        device=torch.cuda.get_device_name(),
        baseline=name,
        greedy=args.greedy,
        hbm_bytes_per_s=bw,
        vocab=args.vocab,
        rank=args.rank,
        steps=args.steps,
        results=results,
    )
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    if args.sweep:
        out["sweep"] = sweep(args)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


# Launch configurations tried by --sweep, each over the module's configuration for the rows: the
# neighbours that fused_markov.GPU_CONFIGS (and, with --greedy, GREEDY_GPU_CONFIGS) was chosen
# among on the H200 (to re-time on a gfx942), and, in both, the dies' program order and the
# blocks a program walks.
DESIGN_SWEEP = [dict(XCDS=1), dict(BLOCKS=1), dict(BLOCKS=2)]
SWEEP = [
    dict(FAST=True),
    dict(FAST=False),
    dict(BV=64, num_warps=4),
    dict(BV=128, num_warps=4),
    dict(BV=128, num_warps=8),
    dict(BV=256, num_warps=8),
    dict(R_TILE=16),
    dict(R_TILE=64),
    dict(BK=64),
    dict(num_stages=2),
    dict(num_stages=3),
    *DESIGN_SWEEP,
]
GREEDY_SWEEP = [
    dict(),
    dict(BK=32, num_stages=3),
    dict(BK=32, num_stages=4),
    dict(BK=64, num_stages=2),
    dict(BK=64, num_stages=3),
    dict(R_TILE=64),
    dict(R_TILE=128),
    dict(BV=128),
    dict(BV=256),
    dict(num_warps=4),
    dict(num_warps=16),
    *DESIGN_SWEEP,
]


def sweep(args) -> list:
    """Fused graphed time of each configuration in SWEEP, for each row count; one that needs more
    than the GPU has (gfx942's 64 KiB of LDS a workgroup) is reported and skipped."""
    found = []
    for rows in (int(r) for r in args.sweep.split(",")):
        spec, w1, w2, base3 = _state(args, rows)
        line = []
        for over in GREEDY_SWEEP if args.greedy else SWEEP:
            cfg = F._config(rows, args.vocab, args.rank, False, over, greedy=args.greedy)
            fused = functools.partial(F._launch, spec, rows, base3, w1, w2, cfg)
            try:
                t = mean_us(graphed(fused), args.iters)
            except OutOfResources as e:  # more LDS than a gfx942 workgroup has (BV 256: 70 KiB)
                found.append(dict(rows=rows, us=None, error=str(e), **cfg))
                line.append(f"{over}: does not fit")
                continue
            found.append(dict(rows=rows, us=t, **cfg))
            line.append(f"{over}: {t:.1f}")
        print(f"sweep rows {rows}: " + ", ".join(line), flush=True)
    return found


if __name__ == "__main__":
    main()
