"""The fused Markov path's check at first use: the first steps of each launch configuration outside
graph capture also run vLLM's loop, and the fused launches serve from then on only when their
output was vLLM's within the issue's rule.

No gfx942 GPU has run the Triton kernels. One that compiles and launches but computes wrongly there
(a compiler's or a Triton release's semantics that neither the interpreter nor the H200 can show)
would propose other drafts, or cache draft logits other than the ones it sampled from, which the
rejection sampler trusts. ``fused_markov.sample_sequential`` therefore runs :func:`first_step`: the
fused launches, then vLLM's loop over the same inputs (whose output the step keeps), then
:func:`compare` on up to ``CHECK_ROWS`` rows spread over the batch (every row tile of the launch
has some in batches up to 2016 rows). A difference keeps the fused path off in the process. The
rule, for each row and step whose earlier tokens agree: a cached value may differ from vLLM's
within ``TOL`` of its and its base logit's magnitudes (a bias's last bf16 bit fits in it; looser
where the base logit dominates), in at most ``MAX_DIFFER`` of the compared values; a sampled
token may differ only where the cached value of one of the two tokens does; an argmax token (a
greedy draft, temperature 0, an inert row) must hold vLLM's maximum logit within ``TOL`` of
it and of both tokens' base logits (either bias may be a last bit off vLLM's).
vLLM's warm-up before it captures a step in a CUDA graph (whose replays are never compared) has
every row inert, and an eager server's first batch may hold only temperature-0 requests, or only
requests at one temperature: a sampled configuration's first comparison also makes the compared
rows live for it (:func:`_live`), in rounds of temperatures that take every temperature path of
the kernels (:func:`_probe_rounds`), so that the sampled paths later steps run are compared.

H200, 129280 tokens, 5 steps, eager: a first step (fused launches, vLLM's loop, comparison) takes
4.3-10.9 ms sampled (1-256 rows; 2.9-9.3 of it the comparison) and 3.9 ms greedy (256 rows),
against 0.4-0.8 ms for the fused launches alone, and holds up to 314 MiB more at its peak (the
copies of 64 rows and a group's temporaries; measured when the base logits of a batch of 64 rows
or fewer were copied too: 82 MB of it at 64 rows, not copied since). From inert rows, with the
probe (a plain case): 6.3-24.5 ms at 8-256 rows, against 3.1-11.6 without it, and up to 393 MiB
at its peak, against 314 (it copies the compared slots' cached logits: 1.3 MB a slot).
"""

from __future__ import annotations

import contextlib

import torch

# Rows compared: all of a batch up to this many, else this many spread over it, so every row tile
# of every launch configuration (32 to 128 rows) has rows compared in batches up to 2016 rows.
# Their cached logits are copied once: 2.6 MB a row at 5 steps of 129280 tokens.
CHECK_ROWS = 64
# Rows judged at a time (the comparison's fp32 temporaries: about 80 MB a group at 5 steps of
# 129280 tokens).
GROUP = 4
# The share of compared cached values that may differ (the bound; measured 0-2e-4).
MAX_DIFFER = 1e-3
# The compared rows' temperatures when they are made live for a sampled configuration's first
# comparison (:func:`first_step`): sampled rows below and above 1, and a greedy
# request among them (an argmax whose logits are cached). Fewer compared rows than these take
# several rounds, so that each reaches a row (:func:`_probe_rounds`).
PROBE_TEMPERATURES = (1.0, 0.6, 0.0, 1.7)
# |vLLM's - fused| <= TOL * (|logit| + |base logit|): a bias's last bf16 bit (at most 2**-7 of
# the bias, which is at most |logit| + |base|) and the add's rounding (2**-8 of the logit).
TOL = 2.0**-6


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bit-equal bf16 values, every NaN equal to every NaN."""
    return (a.view(torch.int16) == b.view(torch.int16)) | (a.isnan() & b.isnan())


def _rows(num_reqs: int) -> list[int]:
    """The compared rows: every row up to CHECK_ROWS, else CHECK_ROWS spread evenly, the first
    and the last among them."""
    if num_reqs <= CHECK_ROWS:
        return list(range(num_reqs))
    return [r * (num_reqs - 1) // (CHECK_ROWS - 1) for r in range(CHECK_ROWS)]


def compare(tokens, cached, live, hot, base, logits_fn, row_ids=None) -> str | None:
    """None when the fused output is vLLM's within the rule, else what differs (the first entry
    in row-major order that breaks it).

    ``tokens`` and ``cached``: (vLLM's, fused) pairs of the rows' draft tokens [R, S] and cached
    logits [R, S, V] bf16 (None without a cache); ``live`` [R, S]: the entry has a cached row;
    ``hot``: it was sampled with noise (else an argmax); ``base`` [R, S, V]: the base logits;
    ``logits_fn(r, i)``: vLLM's logits [V] of row r at step i (fp32), asked only for an argmax
    token that differs; ``row_ids``: the batch row of each of the R rows, for the message. The
    tensors may live on the GPU: the rule is evaluated a GROUP of rows at a time, one host read
    a group, and one for the counts."""
    (t_ref, t_out), rows, vocab = tokens, tokens[0].shape[0], base.shape[-1]
    row_ids = list(range(rows)) if row_ids is None else row_ids
    # An entry is judged while its row's earlier tokens are vLLM's (a row that took another token
    # goes on from other logits).
    same = (t_ref == t_out).long().cumprod(1)
    judged = torch.ones_like(live)
    judged[:, 1:] = same[:, :-1].bool()
    # A token outside the vocabulary (a missed store leaves -1) is wrong on any step, judged or
    # not: no logits make it right.
    outside = (t_out < 0) | (t_out >= vocab)
    token_differs = judged & ~outside & (t_ref != t_out)
    compared = (judged & live).sum() * vocab if cached is not None else 0
    differ = 0
    for r0 in range(0, rows, GROUP):
        g = slice(r0, r0 + GROUP)
        far = torch.zeros_like(live[g])  # a cached value beyond a bias's last bit
        both_cached = torch.zeros_like(live[g])  # a sampled token differs, with both cached alike
        if cached is not None:
            judge = judged[g] & live[g]
            eq = _equal(cached[0][g], cached[1][g])
            bad = ~eq & judge[..., None]
            x, y, z = cached[0][g].float(), cached[1][g].float(), base[g].float()
            near = ((x - y).abs() <= TOL * (x.abs() + z.abs())) & x.isfinite() & y.isfinite()
            far = (bad & ~near).any(-1)
            a = t_ref[g].long().clamp(0, vocab - 1)[..., None]
            b = t_out[g].long().clamp(0, vocab - 1)[..., None]
            alike = (eq.gather(-1, a) & eq.gather(-1, b))[..., 0]
            both_cached = token_differs[g] & hot[g] & alike
            differ = differ + bad.sum()
        argmax_differs = token_differs[g] & ~hot[g]
        flags = torch.stack([outside[g], far, both_cached, argmax_differs], -1).cpu()
        for r, i in flags.any(-1).nonzero().tolist():
            at = f"row {row_ids[r0 + r]} step {i}"
            o, f, c, m = flags[r, i].tolist()
            if o:
                return f"{at}: token {int(t_out[r0 + r, i])} outside the vocabulary"
            if f:
                return f"{at}: a cached logit differs beyond a bias's last bit"
            a, b = int(t_ref[r0 + r, i]), int(t_out[r0 + r, i])
            if c:
                return f"{at}: token {b}, not {a}, with their logits vLLM's"
            logits = logits_fn(r0 + r, i)
            top = logits.max()
            # Either token's bias may be a last bit off vLLM's, which scales with its base logit
            # where the bias cancels it: vLLM's top token's as well as the fused one's.
            step_base = base[r0 + r, i].float()
            slack = TOL * (top.abs() + step_base[a].abs() + step_base[b].abs())
            if not (top.isnan() or bool(logits[b] >= top - slack)):
                return f"{at}: argmax token {b}, not {a}"
    differ, compared = int(differ), int(compared)
    if differ > MAX_DIFFER * max(compared, 1):
        return f"{differ} of {compared} cached logits differ"
    return None


def first_step(
    spec, num_reqs: int, base: torch.Tensor, loop, fused, probe: bool = False
) -> tuple[str | None, bool]:
    """Runs ``fused()`` and then ``loop()`` (vLLM's loop from ``base``, [rows, steps, V]) on the
    speculator's state, the compared rows' tokens set to -1 and their cached logits to NaN before
    the fused launches, so that a store they miss shows. The step's output is vLLM's loop's either
    way. Returns None when :func:`compare` accepts the fused output, else why; and whether any
    compared row was live (vLLM's warm-up rows are all inert).

    With ``probe`` (a configuration's first comparison), a sampled step is first compared with
    the compared rows made live (:func:`_live`), in rounds of temperatures (:func:`_probe_rounds`):
    cached logits, vLLM's noise, each temperature path of the kernels, which later steps (and a
    graph's replays) run uncompared. The step's own rows need not take them: vLLM's warm-up
    before it captures the step in a CUDA graph, whose replays are never compared, has every row
    inert, and an eager server's first batch may hold only temperature-0 requests, or only
    requests at one temperature, and settle the configuration."""
    n_spec = base.shape[1]
    row_ids = _rows(num_reqs)
    sel = torch.tensor(row_ids, device=base.device)
    if probe and spec.draft_logits is not None:
        for temps in _probe_rounds(len(row_ids)):
            with _live(spec, num_reqs, n_spec, sel, temps):
                why, _ = _compare_step(spec, num_reqs, base, loop, fused, row_ids, sel)
            if why is not None:
                loop()  # the step's output: vLLM's loop's on the step's own state
                return why, False
    return _compare_step(spec, num_reqs, base, loop, fused, row_ids, sel)


def _probe_rounds(rows: int) -> list[tuple[float, ...]]:
    """The probe's rounds, each the temperatures of the ``rows`` compared rows: every one of
    PROBE_TEMPERATURES on some row (a round more while fewer rows than temperatures: one row
    otherwise ran temperature 1 alone, two rows never a greedy request), then every row at 1
    (vLLM's default temperature: a row tile none of whose rows divides by its temperature, a
    path that a round of mixed temperatures never takes)."""
    n = len(PROBE_TEMPERATURES)
    rounds = [
        tuple(PROBE_TEMPERATURES[(start + i) % n] for i in range(rows))
        for start in range(0, n, rows)
    ]
    if rows > 1:
        rounds.append((1.0,) * rows)
    return rounds


@contextlib.contextmanager
def _live(spec, num_reqs: int, n_spec: int, sel: torch.Tensor, temps: tuple[float, ...]):
    """The rows ``sel`` live for the duration, every other row inert (a row left live could
    share a slot with a compared row's): each its own request slot, with the temperatures
    ``temps`` (one a row: a round of :func:`_probe_rounds`), a seed and positions of its
    own; every value this changes, and the slots' cached logits, restored after."""
    num_sample = num_reqs * n_spec
    idx_map = spec.sample_idx_mapping[:num_sample].view(num_reqs, n_spec)
    pos = spec.sample_pos[:num_sample].view(num_reqs, n_spec)
    saved = [(t, t.clone()) for t in (idx_map, pos, spec.temperature, spec.seeds)]
    cached = spec.draft_logits[sel]  # a copy (advanced indexing)
    try:
        idx_map.fill_(-1)
        idx_map[sel] = sel[:, None].to(idx_map.dtype)
        pos[sel] = 4097 + torch.arange(n_spec, device=pos.device, dtype=pos.dtype)
        spec.temperature[sel] = torch.tensor(temps, device=sel.device, dtype=spec.temperature.dtype)
        spec.seeds[sel] = (20261204 + 7919 * sel).to(spec.seeds.dtype)
        yield
    finally:
        for t, old in saved:
            t.copy_(old)
        spec.draft_logits[sel] = cached


def _compare_step(spec, num_reqs, base, loop, fused, row_ids, sel) -> tuple[str | None, bool]:
    """:func:`first_step` on the speculator's state as it is."""
    n_spec, vocab = base.shape[1], base.shape[2]
    idx = spec.sample_idx_mapping[: num_reqs * n_spec].view(num_reqs, n_spec)[sel].long()
    req = idx.clamp(min=0)
    steps = torch.arange(n_spec, device=idx.device).expand_as(req)
    cache = spec.draft_logits
    requested = idx >= 0
    live = requested if cache is not None else torch.zeros_like(requested)

    def state():
        tokens = spec.draft_tokens[sel, :n_spec]  # a copy, as the cache's below
        return tokens, None if cache is None else cache[req, steps, :vocab]

    spec.draft_tokens[sel, :n_spec] = -1
    if cache is not None:
        cache[req[live], steps[live], :vocab] = float("nan")
    fused()
    tokens_out, cached_out = state()
    loop()
    tokens_ref, cached_ref = state()
    hot = live & (spec.temperature[req] != 0)
    model = spec.model
    first = spec.input_buffers.input_ids[spec._anchor_idx[sel]]
    # Every row compared: the base logits as they are (vLLM's loop does not write them), not a
    # copy (82 MB at 64 rows).
    base = base if len(row_ids) == num_reqs else base[sel]

    def logits_fn(r: int, i: int) -> torch.Tensor:
        prev = first[r : r + 1] if i == 0 else tokens_ref[r : r + 1, i - 1]
        return (base[r : r + 1, i] + model.markov_bias(model.markov_embed(prev)))[0].float()

    why = compare(
        (tokens_ref, tokens_out),
        None if cache is None else (cached_ref, cached_out),
        live,
        hot,
        base,
        logits_fn,
        row_ids,
    )
    return why, bool(requested.any())
