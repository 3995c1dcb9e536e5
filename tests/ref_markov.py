"""A DSpark speculator built for tests of ``ops.fused_markov``, and the issue's comparison rule.

``make_case`` builds a real ``DSparkSpeculator`` with ``__new__`` and the attributes its
``_sample_sequential`` reads, around a small draft model holding vLLM's own ``DSparkMarkovHead``
and ``LogitsProcessor`` (bf16, random weights); its ``compute_draft_logits`` returns preset base
logits. ``run_both`` runs vLLM 0.33.0's original loop and then the plugin's launches from the
same state (``run_both_plain``: the transcribed loop, ``transcribed_loop``, where the speculator
cannot be imported). ``check_rule`` applies the rule of issue 4:

for every row and step whose earlier tokens equal vLLM's, where the step's cached logits are
bit-equal to vLLM's the token equals vLLM's; a cached value differs from vLLM's only by a
last-bit difference of the bias carried through the add (it is ``bf16(base + b)`` for ``b``
vLLM's bias or one of its bf16 neighbours); at most 1e-3 of the compared values differ; a greedy
(or inert, or zero-temperature) token's logit equals the maximum of vLLM's logits within one ulp.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F


def vllm_sample_sequential():
    """vLLM's ``DSparkSpeculator._sample_sequential``, even when the plugin's patch is on."""
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    fn = DSparkSpeculator._sample_sequential
    return getattr(fn, "__wrapped__", fn)


class DraftModel(torch.nn.Module):
    """The hooks ``_sample_sequential`` calls, as vLLM's DSpark draft models define them."""

    def __init__(self, head, lp, base: torch.Tensor):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.markov_head = head
        self.logits_processor = lp
        self.base = base  # [tokens, V]: hidden row h's base logits are base[h]

    def compute_draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.base[hidden[:, 0].long()]

    def map_draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def markov_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.markov_head.embed(ids)

    def markov_bias(self, embed: torch.Tensor) -> torch.Tensor:
        return self.model.markov_head.bias(embed, self.logits_processor)


def make_head(vocab: int, rank: int, device, gen: torch.Generator, w_scale: float = 0.2):
    """vLLM's DSparkMarkovHead and LogitsProcessor, built on the CPU, random bf16 weights."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.models.qwen3_dspark import DSparkMarkovHead

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        head = DSparkMarkovHead(vocab, vocab, rank, prefix="markov_head")
        lp = LogitsProcessor(vocab)
    head = head.to(device=device, dtype=torch.bfloat16)
    for w in (head.markov_w1.weight, head.markov_w2.weight):
        w.data.copy_((torch.randn(w.shape, generator=gen) * w_scale).to(torch.bfloat16))
    return head, lp


def _add_ties(w2: torch.Tensor, base: torch.Tensor, vocab: int, gen: torch.Generator) -> None:
    """In place: exact ties between tokens a < b (the same Markov row and base logit, raised
    so that they are often near the top: the first token must win), and some -inf entries."""
    for _ in range(4):
        a, b = sorted(torch.randint(0, vocab, (2,), generator=gen).tolist())
        if a != b:
            w2[b] = w2[a]
            base[:, a] += 4.0
            base[:, b] = base[:, a]
    base[torch.rand(base.shape, generator=gen) < 0.01] = float("-inf")


def _request_state(rows, n_spec, vocab, max_num_reqs, greedy, temps, inert, gen, device) -> dict:
    """The per-request attributes ``_sample_sequential`` reads: temperatures from ``temps``,
    seeds, anchors, distinct request slots for the rows (a fraction ``inert`` of them -1, as
    CUDA-graph padding), positions, the draft token buffer and logits cache (None: greedy)."""
    temps = torch.tensor(
        [temps[i] for i in torch.randint(0, len(temps), (max_num_reqs,), generator=gen)],
        dtype=torch.float32,
    )
    seeds = torch.randint(-(2**62), 2**62, (max_num_reqs,), generator=gen)
    state = dict(
        draft_logits=None
        if greedy
        else torch.zeros(max_num_reqs, n_spec, vocab, dtype=torch.bfloat16, device=device),
        # Views one element into their buffers, after a guard: a kernel that reads them for an
        # inert row (request -1) gets temperature 0.7 and another seed, not whatever lies before
        # a fresh tensor (often zero: no noise, as an inert row's).
        temperature=torch.cat([torch.tensor([0.7]), temps]).to(device)[1:],
        seeds=torch.cat([torch.tensor([0x5EED]), seeds]).to(device)[1:],
        draft_tokens=torch.zeros(max_num_reqs, n_spec, dtype=torch.int64, device=device),
        _step_cols=torch.arange(n_spec, dtype=torch.int32, device=device),
        _anchor_idx=torch.arange(max_num_reqs, dtype=torch.int64, device=device) * n_spec,
        input_buffers=types.SimpleNamespace(
            input_ids=torch.randint(0, vocab, (max_num_reqs * n_spec,), generator=gen)
            .to(torch.int32)
            .to(device)
        ),
    )
    slots = torch.randperm(max_num_reqs, generator=gen)[:rows]
    slots[torch.rand(rows, generator=gen) < inert] = -1
    idx = torch.full((max_num_reqs * n_spec,), -1, dtype=torch.int64)
    idx[: rows * n_spec] = slots.repeat_interleave(n_spec)
    state["sample_idx_mapping"] = idx.to(device)
    pos0 = torch.randint(0, 1 << 20, (rows,), generator=gen)
    pos = torch.zeros(max_num_reqs * n_spec, dtype=torch.int64)
    pos[: rows * n_spec] = (pos0[:, None] + 1 + torch.arange(n_spec)).reshape(-1)
    state["sample_pos"] = pos.to(device)
    return state


def make_case(
    *,
    vocab: int,
    rank: int = 64,
    rows: int,
    n_spec: int = 5,
    greedy: bool = False,
    fp64: bool = False,
    seed: int = 0,
    temps=(0.0, 0.3, 1.0, 2.0),
    inert: float = 0.15,
    max_num_reqs: int | None = None,
    device="cpu",
    adversarial: bool = True,
    head=None,
):
    """A speculator in the state of a draft step with ``rows`` requests."""
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    gen = torch.Generator().manual_seed(seed)
    max_num_reqs = max_num_reqs or max(rows, 4)
    if head is None:
        head, lp = make_head(vocab, rank, device, gen)
    else:
        head, lp = head
    num_sample = rows * n_spec
    n_tokens = num_sample + 7
    base = torch.randn(n_tokens, vocab, generator=gen) * 3
    if adversarial:
        # Ties, some -inf entries, one row of -inf only, large values.
        _add_ties(head.markov_w2.weight.data, base, vocab, gen)
        base[n_tokens // 2] = float("-inf")
    base = base.to(torch.bfloat16).to(device)
    model = DraftModel(head, lp, base)

    spec = DSparkSpeculator.__new__(DSparkSpeculator)
    spec.model = model
    spec.device = torch.device(device)
    spec.num_speculative_steps = n_spec
    spec.max_num_reqs = max_num_reqs
    spec.vocab_size = vocab
    spec._draft_topk = None
    spec.draft_watermarker = None
    spec._d2t_scatter_index = None
    spec._draft_scatter_buf = None
    spec.use_confidence_head = False
    spec.acceptance_estimator = None
    spec.use_fp64_gumbel = fp64
    spec.draft_token_confidence_probs = torch.zeros(
        max_num_reqs, n_spec, dtype=torch.float32, device=device
    )
    spec.num_query_per_req = n_spec
    for name, value in _request_state(
        rows, n_spec, vocab, max_num_reqs, greedy, temps, inert, gen, device
    ).items():
        setattr(spec, name, value)
    sample_idx = torch.zeros(max_num_reqs * n_spec, dtype=torch.int64)
    sample_idx[:num_sample] = torch.randperm(n_tokens, generator=gen)[:num_sample]
    spec.sample_indices = sample_idx.to(device)
    head_hidden = torch.arange(n_tokens, device=device)[:, None]
    return spec, head_hidden


def spread_temperatures(spec, rows: int, temps) -> None:
    """Gives the live rows' requests the temperatures ``temps`` in turn, so each one serves
    some row (``make_case`` draws them at random); there must be a live row for each."""
    n_spec = spec.num_speculative_steps
    req = spec.sample_idx_mapping[: rows * n_spec : n_spec]
    req = req[req >= 0]
    assert len(req) >= len(temps), f"{len(req)} live rows for {len(temps)} temperatures"
    spec.temperature[req] = torch.tensor(temps * rows, device=req.device)[: len(req)]


def snapshot(spec):
    return {
        "tokens": spec.draft_tokens.clone(),
        "cache": None if spec.draft_logits is None else spec.draft_logits.clone(),
    }


def _restore(spec, state):
    spec.draft_tokens.copy_(state["tokens"])
    if state["cache"] is not None:
        spec.draft_logits.copy_(state["cache"])


def run_both(spec, rows, head_hidden, fused, fused_only: bool = True):
    """vLLM's loop, then ``fused(spec, rows, head_hidden)`` from the same state: two snapshots.
    With ``fused_only`` a fall-back of the fused call to vLLM's loop (``fused_markov._loop_rest``,
    which also returns True) fails the test, so that a comparison never compares vLLM's loop
    with itself."""
    from unittest import mock

    from dsv41_gfx942_plugin.ops import fused_markov

    start = snapshot(spec)
    vllm_sample_sequential()(spec, rows, head_hidden)
    ref = snapshot(spec)
    _restore(spec, start)
    fell_back = AssertionError("the fused call fell back to vLLM's loop")
    with (
        mock.patch.object(fused_markov, "_loop_rest", side_effect=fell_back)
        if fused_only
        else (contextlib.nullcontext())
    ):
        took = fused(spec, rows, head_hidden)
    out = snapshot(spec)
    return took, ref, out


def _bf16_neighbours(b: torch.Tensor) -> list[torch.Tensor]:
    """b and its two bf16 neighbours (as fp32)."""
    bits = b.to(torch.bfloat16).view(torch.int16).to(torch.int32)
    out = [b.float()]
    for d in (-1, 1):
        nb = (bits + d).to(torch.int16).view(torch.bfloat16).float()
        out.append(torch.where(torch.isfinite(b), nb, b.float()))
    return out


class RuleStats:
    def __init__(self):
        self.compared = 0
        self.differ = 0
        self.tokens = 0
        self.tokens_equal = 0


def model_bias_fn(spec):
    """vLLM's bias of a batch of previous tokens, through the speculator's draft model."""
    model = spec.model
    return lambda prev: model.markov_bias(model.markov_embed(prev))


def check_step(spec, rows, head_hidden, ref, out) -> RuleStats:
    """``check_rule`` on a ``make_case`` step (its base logits and bias from the draft model),
    and vLLM's token at every row and step: a token may differ only where a bias's last bit
    decides it, which none of the seeded cases holds."""
    base3 = model_base(spec, rows, head_hidden)
    stats = check_rule(spec, rows, base3, model_bias_fn(spec), ref, out)
    assert stats.tokens_equal == stats.tokens, (stats.tokens_equal, stats.tokens)
    return stats


def model_base(spec, rows, head_hidden):
    """The step's base logits [rows, n_spec, V], as vLLM's loop computes them."""
    n_spec = spec.num_speculative_steps
    hidden = head_hidden[spec.sample_indices[: rows * n_spec]]
    base = spec.model.compute_draft_logits(hidden)
    return base.view(rows, n_spec, base.shape[-1])


def check_rule(spec, rows, base3, bias_fn, ref, out) -> RuleStats:
    """Asserts the issue's rule on one draft step of ``rows`` rows; returns the counts.

    ``base3`` holds the step's base logits [rows, n_spec, V]; ``bias_fn(prev)`` gives vLLM's
    Markov bias of the previous tokens (it reproduces vLLM's bias bit for bit)."""
    stats = RuleStats()
    n_spec = spec.num_speculative_steps
    num_sample = rows * n_spec
    vocab = base3.shape[-1]
    base = base3.float().cpu()
    idx = spec.sample_idx_mapping[:num_sample].view(rows, n_spec).cpu()
    temp = spec.temperature.cpu()
    greedy = spec.draft_logits is None
    prev = spec.input_buffers.input_ids[spec._anchor_idx[:rows]].long()
    same = torch.ones(rows, dtype=torch.bool)
    checked_cache = None if greedy else torch.zeros(ref["cache"].shape[:2], dtype=torch.bool)
    for i in range(n_spec):
        bias = bias_fn(prev).float().cpu()
        logits = (base[:, i] + bias).to(torch.bfloat16).float()  # vLLM's logits of this step
        t_ref = ref["tokens"][:rows, i].cpu()
        t_out = out["tokens"][:rows, i].cpu()
        assert ((t_out >= 0) & (t_out < vocab)).all(), t_out
        for r in range(rows):
            req = int(idx[r, i])
            if not same[r]:  # an earlier token differs: this step's inputs do too
                if not greedy and req >= 0:
                    checked_cache[req, i] = True
                continue
            stats.tokens += 1
            stats.tokens_equal += int(t_ref[r] == t_out[r])
            hot = not greedy and req >= 0 and float(temp[req]) != 0.0
            if not greedy and req >= 0:
                c_ref = ref["cache"][req, i, :vocab].cpu()
                c_out = out["cache"][req, i, :vocab].cpu()
                checked_cache[req, i] = True
                eq = (c_ref.view(torch.int16) == c_out.view(torch.int16)) | (
                    c_ref.isnan() & c_out.isnan()
                )
                stats.compared += vocab
                stats.differ += int((~eq).sum())
                if eq.all():
                    assert t_ref[r] == t_out[r], (r, i, int(t_ref[r]), int(t_out[r]))
                else:
                    bad = ~eq
                    cands = [
                        (base[r, i] + b).to(torch.bfloat16).float()
                        for b in _bf16_neighbours(bias[r])
                    ]
                    ok = torch.zeros(vocab, dtype=torch.bool)
                    for c in cands:
                        ok |= c == c_out.float()
                    assert ok[bad].all(), (r, i, bad.nonzero()[:5].flatten().tolist())
            if not hot:
                # Argmax rows: the token's logit is the maximum, or the bf16 value just below it.
                mx = logits[r].max()
                if torch.isfinite(mx):
                    assert logits[r, t_out[r]] >= _bf16_below(mx), (r, i, float(mx))
                elif torch.isnan(mx):
                    pass
                else:
                    assert t_out[r] == t_ref[r]
        same &= t_ref == t_out
        prev = ref["tokens"][:rows, i].to(prev.device)
    if not greedy:
        # Every other cached column is untouched, and equal.
        rest = ~checked_cache
        assert torch.equal(
            ref["cache"][rest].view(torch.int16), out["cache"][rest].view(torch.int16)
        )
    # A cached value differs from vLLM's only through a last-bit bias difference: rarely.
    assert stats.differ <= 1e-3 * max(stats.compared, 1), (stats.differ, stats.compared)
    return stats


def _bf16_below(x: torch.Tensor) -> torch.Tensor:
    """The bf16 value just below the (bf16, finite) ``x``, as fp32."""
    x = x.detach()
    bits = x.to(torch.bfloat16).view(torch.int16).to(torch.int32)
    if float(x) > 0:
        bits = bits - 1
    elif float(x) < 0:
        bits = bits + 1
    else:
        bits = torch.tensor(-0x7FFF, dtype=torch.int32)  # 0x8001: the least negative subnormal
    return bits.to(torch.int16).view(torch.bfloat16).float()


def transcribed_loop(spec, rows, base3, w1, w2):
    """vLLM 0.33.0's loop of ``_sample_sequential`` with the draft model's hooks written out:
    ``markov_w1`` embedding, bf16 ``F.linear`` (what ``UnquantizedEmbeddingMethod.apply`` runs),
    the add, then vLLM's own ``gumbel_sample`` (or argmax for greedy drafts). For a machine where
    the speculator cannot be imported (the H200 has only vLLM's Python files)."""
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    n_spec, vocab = base3.shape[1], base3.shape[2]
    num_sample = rows * n_spec
    idx_map = spec.sample_idx_mapping[:num_sample].view(rows, n_spec)
    sample_pos = spec.sample_pos[:num_sample].view(rows, n_spec)
    prev = spec.input_buffers.input_ids[spec._anchor_idx[:rows]]
    for i in range(n_spec):
        bias = F.linear(F.embedding(prev, w1), w2)[..., :vocab]
        logits = base3[:, i] + bias
        if spec.draft_logits is None:
            token = logits.argmax(dim=-1)
        else:
            token = gumbel_sample(
                logits,
                idx_map[:, i],
                spec.temperature,
                spec.seeds,
                sample_pos[:, i] - 1,
                apply_temperature=True,
                is_drafting=True,
                logits_cache=spec.draft_logits,
                logits_cache_col=spec._step_cols[i],
                use_fp64=spec.use_fp64_gumbel,
            )
        spec.draft_tokens[:rows, i] = token
        prev = token


def plain_bias_fn(w1, w2, vocab):
    return lambda prev: F.linear(F.embedding(prev, w1), w2)[..., :vocab]


def make_plain_case(
    *,
    vocab: int,
    rank: int,
    rows: int,
    n_spec: int = 5,
    greedy: bool = False,
    fp64: bool = False,
    seed: int = 0,
    temps=(0.0, 0.3, 1.0, 2.0),
    inert: float = 0.15,
    device="cuda",
):
    """The state ``_sample_sequential`` reads, without vLLM's classes: a namespace speculator,
    ``markov_w1`` [V, rank], ``markov_w2`` [pad64(V), rank] (bf16, random) and base logits
    [rows, n_spec, V]. For ``transcribed_loop`` and ``fused_markov._launch`` where the
    speculator cannot be imported."""
    gen = torch.Generator().manual_seed(seed)
    max_num_reqs = max(rows, 4)
    w1 = (torch.randn(vocab, rank, generator=gen) * 0.2).to(torch.bfloat16).to(device)
    w2 = (torch.randn((vocab + 63) // 64 * 64, rank, generator=gen) * 0.2).to(torch.bfloat16)
    base = torch.randn(rows * n_spec, vocab, generator=gen) * 3
    _add_ties(w2, base, vocab, gen)
    base = base.to(torch.bfloat16).to(device).view(rows, n_spec, vocab)
    spec = types.SimpleNamespace(
        num_speculative_steps=n_spec,
        max_num_reqs=max_num_reqs,
        use_fp64_gumbel=fp64,
        **_request_state(rows, n_spec, vocab, max_num_reqs, greedy, temps, inert, gen, device),
    )
    return spec, w1, w2.to(device), base


def run_both_plain(spec, rows, base3, w1, w2, fused):
    """The transcribed vLLM loop, then ``fused(spec, rows, base3, w1, w2)``, from one state."""
    start = snapshot(spec)
    transcribed_loop(spec, rows, base3, w1, w2)
    ref = snapshot(spec)
    _restore(spec, start)
    fused(spec, rows, base3, w1, w2)
    return ref, snapshot(spec)
