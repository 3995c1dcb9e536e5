"""The fused Markov path's check at first use: the first steps of each launch configuration outside
graph capture also run vLLM's loop, and the fused launches serve from then on only when their
output was vLLM's within the issue's rule.

No gfx942 GPU has run the Triton kernels. One that compiles and launches but computes wrongly
there (a compiler's or a Triton release's semantics that neither the interpreter nor the H200 can
show) would propose other drafts, or cache draft logits other than the ones it sampled from,
which the rejection sampler trusts. ``fused_markov.sample_sequential`` therefore runs
:func:`first_step`: the fused launches, then vLLM's loop over the same inputs (whose output the
step keeps), then :func:`compare` on the first ``CHECK_ROWS`` rows. A difference keeps the fused
path off in the process. The rule, for each row and step whose earlier tokens agree: a cached value
may differ from vLLM's within ``TOL`` of its and its base logit's magnitudes (a bias's last bf16 bit
fits in it; looser where the base logit dominates), in at most ``MAX_DIFFER`` of the compared
values; a sampled token may differ only where the cached value of one of the two tokens does; an
argmax token (a greedy draft, temperature 0, an inert row) must hold vLLM's maximum logit within
``TOL``. H200, 129280 tokens, 5 steps: 24-35 ms a comparison of sampled drafts (8 and 256 rows), 2.8
ms of greedy ones (256 rows), against 0.5-1.0 ms for the fused launches alone (eager).
"""

from __future__ import annotations

import torch

# Rows compared (their cached logits are copied: 2.6 MB a row at 5 steps of 129280 tokens).
CHECK_ROWS = 8
# The share of compared cached values that may differ (the bound; measured 0-2e-4).
MAX_DIFFER = 1e-3
# |vLLM's - fused| <= TOL * (|logit| + |base logit|): a bias's last bf16 bit (at most 2**-7 of
# the bias, which is at most |logit| + |base|) and the add's rounding (2**-8 of the logit).
TOL = 2.0**-6


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bit-equal bf16 values, every NaN equal to every NaN."""
    return (a.view(torch.int16) == b.view(torch.int16)) | (a.isnan() & b.isnan())


def compare(tokens, cached, live, hot, base, logits_fn) -> str | None:
    """None when the fused output is vLLM's within the rule, else what differs.

    ``tokens`` and ``cached``: (vLLM's, fused) pairs of the rows' draft tokens [R, S] and cached
    logits [R, S, V] bf16 (None without a cache); ``live`` [R, S]: the entry has a cached row;
    ``hot``: it was sampled with noise (else an argmax); ``base`` [R, S, V]: the base logits;
    ``logits_fn(r, i)``: vLLM's logits [V] of row r at step i (fp32), asked only for an argmax
    token that differs."""
    (t_ref, t_out), (rows, steps) = tokens, tokens[0].shape
    compared = differ = 0
    for r in range(rows):
        for i in range(steps):
            a, b = int(t_ref[r, i]), int(t_out[r, i])
            if not 0 <= b < base.shape[-1]:
                return f"row {r} step {i}: token {b} outside the vocabulary"
            eq = None
            if bool(live[r, i]):
                c_ref, c_out = cached[0][r, i], cached[1][r, i]
                eq = _equal(c_ref, c_out)
                bad = ~eq
                compared += eq.numel()
                differ += int(bad.sum())
                x, y, z = c_ref[bad].float(), c_out[bad].float(), base[r, i][bad].float()
                near = (x - y).abs() <= TOL * (x.abs() + z.abs())
                if not bool((near & x.isfinite() & y.isfinite()).all()):
                    return f"row {r} step {i}: a cached logit differs beyond a bias's last bit"
            if a == b:
                continue
            if bool(hot[r, i]):
                if bool(eq[a]) and bool(eq[b]):
                    return f"row {r} step {i}: token {b}, not {a}, with their logits vLLM's"
            else:
                logits = logits_fn(r, i)
                top = logits.max()
                slack = TOL * (top.abs() + base[r, i, b].float().abs())
                if not (top.isnan() or bool(logits[b] >= top - slack)):
                    return f"row {r} step {i}: argmax token {b}, not {a}"
            break  # later steps of this row start from another token
    if differ > MAX_DIFFER * max(compared, 1):
        return f"{differ} of {compared} cached logits differ"
    return None


def first_step(spec, num_reqs: int, base: torch.Tensor, loop, fused) -> tuple[str | None, bool]:
    """Runs ``fused()`` and then ``loop()`` (vLLM's loop from ``base``, [rows, steps, V]) on the
    speculator's state, the compared rows' tokens set to -1 and their cached logits to NaN before
    the fused launches, so that a store they miss shows. The step's output is vLLM's loop's either
    way. Returns None when :func:`compare` accepts the fused output, else why; and whether any
    compared row was live (vLLM's warm-up rows are all inert)."""
    n_spec, vocab = base.shape[1], base.shape[2]
    rows = min(num_reqs, CHECK_ROWS)
    idx = spec.sample_idx_mapping[: num_reqs * n_spec].view(num_reqs, n_spec)[:rows].long()
    req = idx.clamp(min=0)
    steps = torch.arange(n_spec, device=idx.device).expand_as(req)
    cache = spec.draft_logits
    requested = idx >= 0
    live = requested if cache is not None else torch.zeros_like(requested)

    def state():
        tokens = spec.draft_tokens[:rows, :n_spec].clone()
        return tokens, None if cache is None else cache[req, steps, :vocab]  # a copy

    spec.draft_tokens[:rows, :n_spec] = -1
    if cache is not None:
        cache[req[live], steps[live], :vocab] = float("nan")
    fused()
    tokens_out, cached_out = state()
    loop()
    tokens_ref, cached_ref = state()
    hot = live & (spec.temperature[req] != 0)
    model = spec.model
    first = spec.input_buffers.input_ids[spec._anchor_idx[:rows]]

    def logits_fn(r: int, i: int) -> torch.Tensor:
        prev = first[r : r + 1] if i == 0 else tokens_ref[r : r + 1, i - 1]
        return (base[r : r + 1, i] + model.markov_bias(model.markov_embed(prev)))[0].float()

    why = compare(
        (tokens_ref.cpu(), tokens_out.cpu()),
        None if cache is None else (cached_ref.cpu(), cached_out.cpu()),
        live.cpu(),
        hot.cpu(),
        base[:rows].cpu(),
        lambda r, i: logits_fn(r, i).cpu(),
    )
    return why, bool(requested.any())
