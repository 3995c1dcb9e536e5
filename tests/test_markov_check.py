"""ops._markov_check, the fused Markov path's comparison with vLLM's loop at first use (CPU).

``compare`` on made-up outputs, one rule at a time (each side of each bound); then the check
wired into ``fused_markov.sample_sequential`` on vLLM 0.33.0's real speculator (the kernels in the
Triton interpreter, where the check is otherwise off: the tests compare every call): the real
kernels pass and serve from then on without vLLM's loop; kernels made to answer wrongly fail it,
the step's output is vLLM's loop's, one warning, and the fused path stays off.
"""

from __future__ import annotations

import pytest
import torch

import test_fused_markov as T  # the interpreter's set-up and skip, the spy
from dsv41_gfx942_plugin._log import LOGGER_NAME, MARKOV_OUT_OF_MEMORY
from dsv41_gfx942_plugin.ops import _markov_check as C
from dsv41_gfx942_plugin.ops import fused_markov as F

pytestmark = T.pytestmark
R = T.R
V = 4096
REAL_LAUNCH = F._launch


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """The check on under the interpreter; nothing logged, broken, checked or failed yet."""
    monkeypatch.setattr(F, "_logged", set())
    monkeypatch.setattr(F, "_broken", set())
    monkeypatch.setattr(F, "_compare_now", lambda key: key not in F._settled)
    monkeypatch.setattr(F, "_checked", set())
    monkeypatch.setattr(F, "_settled", set())
    monkeypatch.setattr(F, "_off_reason", None)


def _outputs(rows=2, steps=3, hot=True):
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(rows, steps, V, generator=g) * 3).bfloat16()
    cached = (base.float() + torch.randn(rows, steps, V, generator=g)).bfloat16()
    tokens = cached.float().argmax(-1)
    live = torch.ones(rows, steps, dtype=torch.bool)
    flags = live if hot else ~live
    return tokens, cached, live, flags, base


def _compare(tokens_out, cached_out, logits=None, hot=True):
    tokens, cached, live, flags, base = _outputs(hot=hot)
    return C.compare(
        (tokens, tokens_out(tokens.clone())),
        (cached, cached_out(cached.clone())),
        live,
        flags,
        base,
        logits or (lambda r, i: cached[r, i].float()),
    )


def _same(x):
    return x


def _set(r, i, col, value):
    def f(x):
        x[r, i, col] = value
        return x

    return f


def _token(r, i, value):
    def f(t):
        t[r, i] = value
        return t

    return f


def test_equal_outputs_pass():
    assert _compare(_same, _same) is None


def test_a_cached_logit_off_by_a_bias_bit_passes_and_beyond_fails():
    tokens, cached, *_ = _outputs()
    x = float(cached[0, 1, 5])
    near = x + 2.0**-7 * abs(x)  # one or two bf16 ulps
    assert _compare(_same, _set(0, 1, 5, near)) is None
    why = "row 0 step 1: a cached logit differs beyond a bias's last bit"
    assert _compare(_same, _set(0, 1, 5, x + 1.0 + abs(x))) == why
    assert _compare(_same, _set(0, 1, 5, float("inf"))) == why
    # Twice TOL's bound (bf16's rounding of the stored value takes at most 2**-9 of it): fails.
    b = float(_outputs()[4][0, 1, 5])
    assert _compare(_same, _set(0, 1, 5, x + 2.0**-5 * (abs(x) + abs(b)))) == why


def test_a_nan_logit_passes_whatever_its_bits():
    """A NaN (a NaN base logit) is vLLM's NaN whatever its sign and payload: bits that differ
    from vLLM's must not turn the fused path off."""
    tokens, cached, live, hot, base = _outputs()
    cached[0, 1, 5] = float("nan")
    out = cached.clone()
    out.view(torch.int16)[0, 1, 5] = -64  # 0xFFC0: a negative quiet NaN
    assert cached.view(torch.int16)[0, 1, 5] != -64 and out[0, 1, 5].isnan()
    assert C.compare((tokens, tokens), (cached, out), live, hot, base, None) is None


def test_a_masked_logit_must_stay_masked():
    """vLLM's -inf (a -inf base logit) is no bias's last bit away from a finite value, nor is a
    fused -inf from vLLM's finite value, even where that value and its base logit are so large
    that the bound (TOL times their magnitudes) overflows to inf."""
    tokens, cached, live, hot, base = _outputs()
    cached[1, 2, 9] = float("-inf")
    out = cached.clone()
    out[1, 2, 9] = -3.0e38
    why = C.compare((tokens, tokens), (cached, out), live, hot, base, None)
    assert why == "row 1 step 2: a cached logit differs beyond a bias's last bit"
    cached[1, 2, 9] = base[1, 2, 9] = -3.0e38
    out[1, 2, 9] = float("-inf")
    why = C.compare((tokens, tokens), (cached, out), live, hot, base, None)
    assert why == "row 1 step 2: a cached logit differs beyond a bias's last bit"


def test_a_token_outside_the_vocabulary_fails():
    assert _compare(_token(0, 0, -1), _same) == "row 0 step 0: token -1 outside the vocabulary"
    assert _compare(_token(1, 2, V), _same) == f"row 1 step 2: token {V} outside the vocabulary"


def test_a_token_outside_the_vocabulary_fails_on_an_unjudged_step():
    """After a row's token differs from vLLM's, its later steps go on from other logits and are
    not judged; a token outside the vocabulary there (a missed store leaves -1) still fails."""

    def both(t):
        t[0, 0] = (t[0, 0] + 1) % V  # an argmax token that differs: row 0's later steps unjudged
        t[0, 2] = -1
        return t

    flat = lambda r, i: torch.zeros(V)  # noqa: E731 (vLLM's logits tie there: the token passes)
    assert _compare(both, _same, flat, hot=False) == "row 0 step 2: token -1 outside the vocabulary"


def test_too_many_small_differences_fail():
    def shift(x):
        b = x.view(torch.int16)
        b[0, 0, :30] += 1  # one bf16 ulp each, 30 of 6 * 4096 values: more than 1e-3
        return x

    assert _compare(_same, shift) == "30 of 24576 cached logits differ"


def test_exactly_max_differ_of_the_values_may_differ():
    """The bound's edge: 1 of 1000 compared values differing (MAX_DIFFER of them) passes, 2 do
    not."""
    tokens, live = torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool)
    base = torch.ones(1, 1, 1000, dtype=torch.bfloat16)
    cached = base.clone()
    for n, why in ((1, None), (2, "2 of 1000 cached logits differ")):
        out = cached.clone()
        out.view(torch.int16)[0, 0, :n] += 1  # one bf16 ulp: within a bias's last bit
        assert C.compare((tokens, tokens), (cached, out), live, live, base, None) == why


def test_a_sampled_token_may_differ_only_where_a_cached_value_does():
    tokens, *_ = _outputs()
    a, other = int(tokens[1, 0]), (int(tokens[1, 0]) + 3) % V
    assert _compare(_token(1, 0, other), _same) == (
        f"row 1 step 0: token {other}, not {a}, with their logits vLLM's"
    )
    x = float(_outputs()[1][1, 0, other])
    assert _compare(_token(1, 0, other), _set(1, 0, other, x + 2.0**-7 * abs(x))) is None
    x = float(_outputs()[1][1, 0, a])  # vLLM's token's value differs instead
    assert _compare(_token(1, 0, other), _set(1, 0, a, x - 2.0**-7 * abs(x))) is None


def test_later_steps_of_a_row_whose_token_differs_are_not_judged():
    tokens, cached, *_ = _outputs()
    other = (int(tokens[1, 0]) + 3) % V
    x = float(cached[1, 0, other])

    def both(c):
        c[1, 0, other] = x + 2.0**-7 * abs(x)
        c[1, 2, 7] = 1e4  # after the difference: another previous token, other logits
        return c

    assert _compare(_token(1, 0, other), both) is None


def test_the_bound_counts_only_judged_values():
    """MAX_DIFFER is a share of the values judged: a row's steps after a token that differs
    (legitimately: its value differs) are not judged, and not counted among the compared."""
    tokens, cached, *_ = _outputs()
    other = (int(tokens[1, 0]) + 3) % V
    x = float(cached[1, 0, other])

    def spoil(c):
        c[1, 0, other] = x + 2.0**-7 * abs(x)
        b = c.view(torch.int16)
        b[0, 0, :19] += 1  # one bf16 ulp each: 20 of 4 judged x 4096 values, over 1e-3 of them
        return c

    assert _compare(_token(1, 0, other), spoil) == "20 of 16384 cached logits differ"


def test_the_largest_difference_of_a_bias_last_bit_passes():
    """TOL's bound is tight: the bias b = 4 and its bf16 neighbour 4 + 2**-5, added to the base
    logit 2**-6, round to 4 and 4 + 2**-4 (ties to even, the other way each): a difference of
    2**-4, 0.996 of TOL * (|4| + |2**-6|), the largest share of the bound that a search of bf16
    biases, their neighbours and base logits found."""
    tokens, cached, live, hot, base = _outputs()
    base[0, 1, 5], cached[0, 1, 5] = 2.0**-6, 4.0
    assert float(cached[0, 1, 5] + 4.0) == 8.0  # bf16: what follows is exact
    out = cached.clone()
    out[0, 1, 5] = 4.0 + 2.0**-4
    assert float((base[0, 1, 5].float() + (4.0 + 2.0**-5)).bfloat16()) == 4.0 + 2.0**-4
    assert float((base[0, 1, 5].float() + 4.0).bfloat16()) == 4.0
    assert C.compare((tokens, tokens), (cached, out), live, hot, base, None) is None


def test_an_argmax_token_must_hold_the_maximum():
    tokens, cached, *_ = _outputs(hot=False)
    logits = cached[0, 2].float()
    top, second, low = int(logits.argmax()), int(logits.topk(2).indices[1]), int(logits.argmin())
    tie = logits.clone()
    tie[second] = tie[top] - 2.0**-8 * abs(float(tie[top]))
    assert _compare(_token(0, 2, second), _same, lambda r, i: tie, hot=False) is None
    assert _compare(_token(0, 2, low), _same, lambda r, i: logits, hot=False) == (
        f"row 0 step 2: argmax token {low}, not {top}"
    )
    # vLLM's logits hold a NaN: no token is judged against it (vLLM's argmax of a sampled
    # configuration's row keeps or drops a NaN by its position on a GPU).
    nan = logits.clone()
    nan[7] = float("nan")
    assert _compare(_token(0, 2, low), _same, lambda r, i: nan, hot=False) is None


@pytest.mark.parametrize("large", ["fused token", "vllm's top token"])
def test_an_argmax_tokens_slack_counts_both_base_logits(large):
    """Either token's bias may be a bf16 last bit off vLLM's, which scales with its base logit
    where the bias cancels it: one token's base 64 (the other's 0), a bf16 bit of its bias 2**-2;
    vLLM's logit of the fused token 0.25 against a maximum of 0.5 passes; -0.625, beyond
    TOL * (0.5 + 64 + 0) below it, does not."""
    tokens, cached, live, hot, base = _outputs(hot=False)
    top, b = int(tokens[0, 2]), (int(tokens[0, 2]) + 1) % V
    base[0, 2, b], base[0, 2, top] = (64.0, 0.0) if large == "fused token" else (0.0, 64.0)
    logits = torch.full((V,), -10.0)
    logits[top], logits[b] = 0.5, 0.25
    out = tokens.clone()
    out[0, 2] = b
    args = ((tokens, out), (cached, cached), live, hot, base)
    assert C.compare(*args, lambda r, i: logits) is None
    logits[b] = -0.625
    assert C.compare(*args, lambda r, i: logits) == f"row 0 step 2: argmax token {b}, not {top}"


@pytest.mark.parametrize("rows,tile,least", [(1, 16, 1), (64, 16, 16), (65, 16, 4), (256, 16, 3),
                                             (2016, 32, 1)])  # fmt: skip
def test_compared_rows_reach_every_row_tile(rows, tile, least):
    """Every row up to CHECK_ROWS, else that many spread evenly: the first and the last rows
    among them, and ``least`` in each row tile (a batch above 64 rows runs tiles of 32 and up;
    the README claims one in each up to 2016 rows)."""
    got = C._rows(rows)
    assert got == sorted(set(got)) and len(got) == min(rows, C.CHECK_ROWS)
    assert got[0] == 0 and got[-1] == rows - 1
    for t in range(0, rows, tile):
        assert sum(t <= r < t + tile for r in got) >= min(rows - t, least)


def test_the_real_kernels_pass_and_serve_without_the_loop(clean_plugin):
    """Each configuration's first step is compared (counted as vLLM's loop, whose output it
    keeps), the next served by the fused launches alone (counted as taken)."""
    for greedy in (False, True):
        spec, hidden = R.make_case(vocab=700, rows=5, n_spec=3, greedy=greedy, seed=81)
        took, ref, out = R.run_both(spec, 5, hidden, F.sample_sequential, fused_only=False)
        assert took and F._off_reason is None and len(F._settled) == 1 + greedy
        R.check_step(spec, 5, hidden, ref, out)
        took, ref, out = R.run_both(spec, 5, hidden, F.sample_sequential)  # no loop now
        assert took
    assert clean_plugin.stats()["fused_markov"] == {
        "taken": 2, "declined": 2, "reasons": {"compared with vLLM's loop": 2}}  # fmt: skip


def test_inert_rows_only_compare_again_at_the_next_step():
    """vLLM's warm-up (every row inert: no cached logits) compares a sampled configuration, so a
    graph may capture it, but its next step outside capture is compared again."""
    spec, hidden = R.make_case(vocab=700, rows=5, n_spec=3, inert=1.0, seed=84)
    took, ref, out = R.run_both(spec, 5, hidden, F.sample_sequential, fused_only=False)
    assert took and len(F._checked) == 1 and F._settled == set()
    with pytest.raises(AssertionError, match="fell back to vLLM's loop"):
        R.run_both(spec, 5, hidden, F.sample_sequential)  # the comparison runs the loop


def test_only_a_configurations_first_comparison_probes(monkeypatch):
    """The probe (several comparisons with the compared rows made live) runs at a configuration's
    first comparison only: vLLM's inert warm-up compares with it and does not settle, the next
    step compares its own rows without it and settles, and the one after is not compared."""
    probes = []

    def first_step(spec, num_reqs, base, loop, fused, probe=False):
        probes.append(probe)
        loop()
        return None, len(probes) > 1  # inert rows, then live ones

    monkeypatch.setattr(C, "first_step", first_step)
    spec, hidden = R.make_case(vocab=300, rows=3, n_spec=2, seed=94)
    for _ in range(3):
        assert F.sample_sequential(spec, 3, hidden)
    assert probes == [True, False] and len(F._settled) == 1


def test_a_missed_cache_store_shows_over_vllms_own_values(monkeypatch):
    """The compared slots' cached logits are NaN before the fused launches: kernels that compute
    the tokens but store no cached logit fail the comparison even where the cache already holds
    vLLM's values for the same inputs (the step run again; no probe: compared before)."""

    def launch(spec, *args, **kwargs):  # the kernels, their cache stores lost
        cache = spec.draft_logits.clone()
        REAL_LAUNCH(spec, *args, **kwargs)
        spec.draft_logits.copy_(cache)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=300, rows=3, n_spec=2, temps=(1.0,), inert=0.0, seed=95)
    F._checked.add(F._launch_key(spec, 3, spec.device)[0])
    R.vllm_sample_sequential()(spec, 3, hidden)  # the cache: vLLM's values of this step
    assert F.sample_sequential(spec, 3, hidden)
    assert "row 0 step 0: a cached logit differs beyond a bias's last bit" in F._off_reason


def test_the_probe_gives_each_row_its_own_seed(monkeypatch):
    """The probe's rows draw their noise from seeds of their own: kernels that read another
    row's seed are caught at vLLM's inert warm-up."""

    def launch(spec, num_reqs, base, *args, **kwargs):
        live = spec.sample_idx_mapping[: num_reqs * base.shape[1]]
        slots = live[live >= 0].unique()
        saved = spec.seeds.clone()
        spec.seeds[slots] = spec.seeds[slots[0]].clone()
        REAL_LAUNCH(spec, num_reqs, base, *args, **kwargs)
        spec.seeds.copy_(saved)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=300, rows=3, n_spec=2, inert=1.0, seed=97)
    assert F.sample_sequential(spec, 3, hidden)
    assert "token" in F._off_reason


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy-drafts", "temperature-0"])
def test_a_wrong_argmax_token_fails(greedy, monkeypatch):
    """Argmax tokens are judged by vLLM's logits: greedy drafts (no cache; their requests'
    temperature, 1 here, plays no part) and a sampled configuration's live temperature-0 requests
    (logits cached). Kernels that take another token, its cached value a bias's last bit off
    vLLM's (no cached value differs beyond one), fail (no probe: compared before)."""

    def launch(spec, *args, **kwargs):
        REAL_LAUNCH(spec, *args, **kwargs)
        _next_token(spec)
        if spec.draft_logits is not None:
            slot, token = int(spec.sample_idx_mapping[0]), int(spec.draft_tokens[0, 0])
            spec.draft_logits[slot, 0].view(torch.int16)[token] += 1

    monkeypatch.setattr(F, "_launch", launch)
    temps = (1.0,) if greedy else (0.0,)
    spec, hidden = R.make_case(
        vocab=700, rows=3, n_spec=2, greedy=greedy, temps=temps, inert=0.0, seed=96
    )
    F._checked.add(F._launch_key(spec, 3, spec.device)[0])
    assert F.sample_sequential(spec, 3, hidden)
    assert "row 0 step 0: argmax token" in F._off_reason


def test_the_probe_keys_each_step_at_its_own_position(monkeypatch):
    """The probe's rows draw each step's noise at a position of its own: kernels that key every
    step's noise with the first step's position are caught at vLLM's inert warm-up."""

    def launch(spec, num_reqs, base, *args, **kwargs):
        pos = spec.sample_pos[: num_reqs * base.shape[1]].view(num_reqs, base.shape[1])
        saved = pos.clone()
        pos[:, 1:] = pos[:, :1]
        REAL_LAUNCH(spec, num_reqs, base, *args, **kwargs)
        pos.copy_(saved)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=300, rows=3, n_spec=2, inert=1.0, seed=97)
    assert F.sample_sequential(spec, 3, hidden)
    assert "step 1: token" in F._off_reason


@pytest.mark.parametrize("wrong", [False, True])
def test_an_inert_first_comparison_makes_rows_live(wrong, monkeypatch):
    """vLLM's warm-up before a graph captures a sampled configuration has every row inert (no
    cached logits, no noise), so its first comparison makes the compared rows live: kernels
    right there pass (PROBE_TEMPERATURES, a greedy request among them), ones wrong only on a
    live row's cached logits are caught; either way the step's output is vLLM's loop's on the
    inert state, and every value the probe changed is restored."""

    def launch(spec, *args, **kwargs):
        REAL_LAUNCH(spec, *args, **kwargs)
        if wrong and int(spec.sample_idx_mapping[1]) >= 0:  # a live row 0
            _raise_a_logit(spec)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=700, rows=5, n_spec=3, inert=1.0, seed=88)
    state = ("sample_idx_mapping", "sample_pos", "temperature", "seeds", "draft_logits")
    before = {name: getattr(spec, name).clone() for name in state}
    took, ref, out = R.run_both(spec, 5, hidden, F.sample_sequential, fused_only=False)
    assert took and torch.equal(ref["tokens"], out["tokens"])
    for name in state:
        assert torch.equal(getattr(spec, name), before[name]), name
    if wrong:
        assert "row 0 step 1: a cached logit differs beyond a bias's last bit" in F._off_reason
    else:
        assert F._off_reason is None and len(F._checked) == 1 and F._settled == set()


@pytest.mark.parametrize("rows,wrong", [(5, False), (5, True), (70, False)])
def test_a_first_comparison_without_noise_makes_rows_live(rows, wrong, monkeypatch):
    """An eager server's first batch may hold only temperature-0 requests: live rows with cached
    logits, no noise. That comparison must not settle a sampled configuration whose noisy path
    it never ran: the probe makes the compared rows live with noise first (every other row inert
    for it: 70 rows, 6 of them not compared), so kernels wrong only where noise is drawn are
    caught; either way the step's output is vLLM's loop's and the probe's changes are undone."""

    def launch(spec, *args, **kwargs):
        REAL_LAUNCH(spec, *args, **kwargs)
        slot = int(spec.sample_idx_mapping[1])  # row 0
        if wrong and slot >= 0 and float(spec.temperature[slot]) != 0:
            _raise_a_logit(spec)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=300, rows=rows, n_spec=3, temps=(0.0,), inert=0.0, seed=89)
    state = ("sample_idx_mapping", "sample_pos", "temperature", "seeds")
    before = {name: getattr(spec, name).clone() for name in state}
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential, fused_only=False)
    assert took and torch.equal(ref["tokens"], out["tokens"])
    assert torch.equal(ref["cache"], out["cache"])
    for name in state:
        assert torch.equal(getattr(spec, name), before[name]), name
    if wrong:
        assert "row 0 step 1: a cached logit differs beyond a bias's last bit" in F._off_reason
    else:
        assert F._off_reason is None and len(F._settled) == 1


def _next_token(spec):
    spec.draft_tokens[0, 0] = (spec.draft_tokens[0, 0] + 1) % 700


def _raise_a_logit(spec):
    spec.draft_logits[int(spec.sample_idx_mapping[1]), 1, 3] = 1e4  # row 0, step 1


def _raise_last_row(spec):
    spec.draft_logits[int(spec.sample_idx_mapping[69 * 3 + 2]), 2, 5] = 1e4  # row 69, step 2


def _lose_cache_stores(spec):
    spec.draft_logits[int(spec.sample_idx_mapping[0]), 0] = float("nan")  # row 0, step 0


def test_a_wrong_row_past_the_first_tiles_fails(monkeypatch):
    """A batch of 70 rows (more than CHECK_ROWS): its last row, in a row tile of its own, is
    compared too, and a wrong cached logit there turns the fused path off."""

    def launch(spec, *args, **kwargs):
        REAL_LAUNCH(spec, *args, **kwargs)
        _raise_last_row(spec)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=300, rows=70, n_spec=3, temps=(1.0,), inert=0.0, seed=86)
    took, ref, out = R.run_both(spec, 70, hidden, F.sample_sequential, fused_only=False)
    assert took and torch.equal(ref["cache"], out["cache"])
    assert "row 69 step 2: a cached logit differs beyond a bias's last bit" in F._off_reason


@pytest.mark.parametrize("rows", [5, 70])
def test_base_logits_copied_only_for_a_subset(rows, monkeypatch):
    """A batch compared whole judges the base logits in place; one of more than CHECK_ROWS rows,
    a copy of the compared rows'."""
    seen = []
    real = C.compare

    def compare(tokens, cached, live, hot, base, logits_fn, row_ids=None):
        seen.append(base)
        return real(tokens, cached, live, hot, base, logits_fn, row_ids)

    monkeypatch.setattr(C, "compare", compare)
    spec, hidden = R.make_case(vocab=300, rows=rows, n_spec=2, temps=(1.0,), inert=0.0, seed=87)
    took, ref, out = R.run_both(spec, rows, hidden, F.sample_sequential, fused_only=False)
    assert took and F._off_reason is None
    assert len(seen) == len(C._probe_rounds(min(rows, C.CHECK_ROWS))) + 1  # the probe's, the step's
    for base in seen:
        assert base.shape[0] == min(rows, C.CHECK_ROWS)
        assert base._is_view() == (rows <= C.CHECK_ROWS)


def test_an_argmax_token_is_judged_by_its_own_rows_logits(monkeypatch):
    """Past CHECK_ROWS rows the compared rows are spread over the batch: the logits an argmax
    token is judged by are its own row's, at the first step from its anchor token, then from
    vLLM's token of the step before (greedy drafts, 70 rows; kernels that store nothing)."""
    seen = []
    real = C.compare

    def compare(tokens, cached, live, hot, base, logits_fn, row_ids=None):
        seen.append((logits_fn, row_ids))
        return real(tokens, cached, live, hot, base, logits_fn, row_ids)

    monkeypatch.setattr(C, "compare", compare)
    monkeypatch.setattr(F, "_launch", lambda *args, **kwargs: None)
    spec, hidden = R.make_case(vocab=300, rows=70, n_spec=2, greedy=True, seed=98)
    assert F.sample_sequential(spec, 70, hidden) and "outside the vocabulary" in F._off_reason
    ((logits_fn, row_ids),) = seen
    base, bias = R.model_base(spec, 70, hidden), R.model_bias_fn(spec)
    row = row_ids[63]
    assert row == 69
    prev = (
        spec.input_buffers.input_ids[spec._anchor_idx[row : row + 1]],
        spec.draft_tokens[row : row + 1, 0],
    )
    for i in range(2):
        want = (base[row : row + 1, i] + bias(prev[i]))[0].float()
        assert torch.equal(logits_fn(63, i), want)


@pytest.mark.parametrize(
    "spoil,why",
    [
        (_next_token, "row 0 step 0: token"),
        (_raise_a_logit, "row 0 step 1: a cached logit differs beyond a bias's last bit"),
        (None, "row 0 step 0: token -1 outside the vocabulary"),  # no stores at all
        (_lose_cache_stores, "row 0 step 0: a cached logit differs beyond a bias's last bit"),
    ],
)
def test_wrong_kernels_fail_and_vllms_loop_serves(spoil, why, monkeypatch, plugin_log):
    def launch(spec, *args, **kwargs):  # the kernels, then a wrong answer; or nothing at all
        if spoil is not None:
            REAL_LAUNCH(spec, *args, **kwargs)
            spoil(spec)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=700, rows=3, n_spec=3, temps=(1.0,), inert=0.0, seed=82)
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential, fused_only=False)
    assert took and why in F._off_reason
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])
    warned = [r for r in plugin_log.records if "differ from vLLM's loop" in r.getMessage()]
    assert [r.levelname for r in warned] == ["WARNING"]
    T._assert_declines(spec, hidden, 3, F._off_reason, T._install_spy(monkeypatch), plugin_log)


def test_out_of_memory_in_the_comparison_is_no_broken_configuration(
    monkeypatch, plugin_log, clean_plugin
):
    """The comparison's copies find no memory: this step is vLLM's loop from the base logits
    already computed (computed once: a second time would repeat the lm_head's tensor-parallel
    all-gather on this rank alone), the winners are reset, nothing is marked broken or compared,
    and the next step compares. Two such steps: one WARNING, both counted under their reason."""
    real = C.first_step

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("no memory")

    monkeypatch.setattr(C, "first_step", no_memory)
    spec, hidden = R.make_case(vocab=700, rows=3, n_spec=3, seed=85)
    heads = []
    compute = spec.model.compute_draft_logits
    monkeypatch.setattr(spec.model, "compute_draft_logits", lambda h: heads.append(1) or compute(h))
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential, fused_only=False)
    assert took and heads == [1, 1]  # vLLM's run, then the fused call's: once each
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])
    assert F._broken == set() and F._checked == set() and F._off_reason is None
    assert (F._scratch(spec, torch.device("cpu"), 700)["win"] == -(2**63)).all()
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential, fused_only=False)
    assert took and heads == [1] * 4 and torch.equal(ref["tokens"], out["tokens"])
    ours = [r for r in plugin_log.records if r.name == LOGGER_NAME]
    assert [r.getMessage() for r in ours if r.levelname == "WARNING"] == [MARKOV_OUT_OF_MEMORY]
    loop = {"vLLM's loop from the base logits (out of memory)": 2}
    assert clean_plugin.stats()["fused_markov"] == {"taken": 0, "declined": 2, "reasons": loop}
    monkeypatch.setattr(C, "first_step", real)
    took, ref, out = R.run_both(spec, 3, hidden, F.sample_sequential, fused_only=False)
    assert took and len(F._settled) == 1


def test_out_of_memory_in_vllms_loop_after_the_base_logits_goes_to_vllm(monkeypatch, clean_plugin):
    """vLLM's own loop (from this step's base logits) finds no memory: the error reaches vLLM
    through the patch, marked ``dsv41_after_base``, not a second run of vLLM's whole step (a
    second all-gather); the step is counted once."""
    from dsv41_gfx942_plugin import speculator

    def no_memory(*args):
        raise torch.OutOfMemoryError("no memory")

    monkeypatch.setattr(F, "_loop_rest", no_memory)
    monkeypatch.setattr(F, "_buffers", {})
    monkeypatch.setattr(F, "_scratch", no_memory)  # the scratch's OOM branch takes the loop
    spec, hidden = R.make_case(vocab=700, rows=3, n_spec=3, seed=86)
    with pytest.raises(torch.OutOfMemoryError) as err:
        speculator._fused(spec, 3, hidden)
    assert err.value.dsv41_after_base
    loop = "vLLM's loop from the base logits (out of memory)"
    assert clean_plugin.stats()["fused_markov"] == {"taken": 0, "declined": 1, "reasons": {loop: 1}}


@pytest.mark.parametrize(
    "error,what",
    [(torch.OutOfMemoryError, "out of memory"), (RuntimeError, "an error")],
    ids=["oom", "runtime"],
)
def test_an_error_in_vllms_draft_logits_goes_to_vllm(error, what, monkeypatch, clean_plugin):
    """vLLM's own draft logits (the lm_head and its tensor-parallel all-gather) raise, out of
    memory or otherwise: raised to vLLM, as without the plugin, not retried by vLLM's whole step
    (a second all-gather on this rank alone); counted once, and the fused path stays on."""
    from dsv41_gfx942_plugin import speculator

    def fails(*args):
        raise error("vLLM's op failed")

    spec, hidden = R.make_case(vocab=700, rows=3, n_spec=3, seed=89)
    monkeypatch.setattr(spec.model, "compute_draft_logits", fails)
    with pytest.raises(error) as err:
        speculator._fused(spec, 3, hidden)
    assert err.value.dsv41_after_base and not speculator._fused_failed
    why = f"{what} in vLLM's draft logits"
    assert clean_plugin.stats()["fused_markov"] == {"taken": 0, "declined": 1, "reasons": {why: 1}}
    assert F._off_reason is None


def _bug(*args):
    raise ValueError("a plugin bug")


def _failing_winners_reset(monkeypatch):
    """A launch that fails to compile, then the winners' reset after it raises."""
    monkeypatch.setattr(F, "_launch", _bug)
    real = F._scratch

    class Win:
        def fill_(self, value):
            raise ValueError("a plugin bug")

    monkeypatch.setattr(F, "_scratch", lambda *a: dict(real(*a), win=Win()))


@pytest.mark.parametrize(
    "spoil",
    [
        lambda mp: mp.setattr(F, "_launch_key", _bug),
        lambda mp: mp.setattr(F, "_scratch", _bug),
        _failing_winners_reset,
    ],
    ids=["launch-key", "scratch", "winners-reset"],
)
def test_a_plugin_error_after_the_base_logits_finishes_with_vllms_loop(
    spoil, monkeypatch, clean_plugin, plugin_log
):
    """The fused path raises, outside its launches' handler, once the step's base logits exist:
    vLLM's loop finishes the step from them (computed once: running vLLM's whole step again
    would repeat the lm_head's all-gather on this rank alone), vLLM's tokens and cache, one
    ERROR, counted as vLLM's loop; the fused path then declines every step, computing nothing."""
    from dsv41_gfx942_plugin import speculator

    spec, hidden = R.make_case(vocab=700, rows=3, n_spec=3, seed=91)
    heads = []
    compute = spec.model.compute_draft_logits
    monkeypatch.setattr(spec.model, "compute_draft_logits", lambda h: heads.append(1) or compute(h))
    spoil(monkeypatch)
    cleared = []  # the HIP last error the failure may leave, reset before vLLM's loop
    monkeypatch.setattr(F._launcher, "clear_last_error", lambda: cleared.append(1) or 0)
    took, ref, out = R.run_both(spec, 3, hidden, speculator._fused, fused_only=False)
    assert took and heads == [1, 1]  # vLLM's run, then the fused call's: once each
    assert len(cleared) == (2 if spoil is _failing_winners_reset else 1)  # launch, then reset
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])
    assert F._off_reason.startswith("raised after the base logits (ValueError('a plugin bug'")
    errors = [r for r in plugin_log.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "after the step's base logits" in errors[0].getMessage()
    loop = {"vLLM's loop from the base logits (raised)": 1}
    assert clean_plugin.stats()["fused_markov"] == {"taken": 0, "declined": 1, "reasons": loop}
    heads.clear()
    assert not F.sample_sequential(spec, 3, hidden) and heads == []


def test_vllms_loop_runs_once_the_failed_step_is_freed(monkeypatch):
    """The loop that finishes a step whose comparison found no memory runs after the handler has
    let go of the failed comparison's frames (their copies: up to about 400 MiB)."""
    import weakref

    held, freed = [], []
    real = F._loop_rest

    def first_step(*args, **kwargs):
        copy = torch.empty(1000)
        held.append(weakref.ref(copy))
        raise torch.OutOfMemoryError("no memory")

    def loop(*args):
        freed.append(held[0]() is None)
        return real(*args)

    monkeypatch.setattr(C, "first_step", first_step)
    monkeypatch.setattr(F, "_loop_rest", loop)
    spec, hidden = R.make_case(vocab=700, rows=3, n_spec=3, seed=90)
    assert F.sample_sequential(spec, 3, hidden) and freed == [True]


def test_the_probe_under_a_bf16_default_dtype():
    """vLLM builds its model under a bf16 default dtype: the probe's temperatures take the
    speculator's dtype, and everything is restored."""
    spec, _ = R.make_case(vocab=700, rows=5, n_spec=3, inert=1.0, seed=91)
    before = spec.temperature.clone()
    sel = torch.tensor([0, 2, 4])
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with C._live(spec, 5, 3, sel, C._probe_rounds(3)[0]):
            want = torch.tensor(C.PROBE_TEMPERATURES[:3], dtype=spec.temperature.dtype)
            assert torch.equal(spec.temperature[sel], want)
    finally:
        torch.set_default_dtype(old)
    assert torch.equal(spec.temperature, before)


def test_capture_before_the_comparison_declines(monkeypatch):
    """Inside capture, a configuration not yet compared is declined (vLLM's loop is captured);
    once compared, or outside capture, not. Only on a GPU: the interpreter is never checked."""
    spec, _ = T._base_case(seed=83)
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert F._capturing_unchecked(spec, 3, cuda)
    assert not F._capturing_unchecked(spec, 3, torch.device("cpu"))
    F._checked.add(F._launch_key(spec, 3, cuda)[0])
    assert not F._capturing_unchecked(spec, 3, cuda)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(F, "_checked", set())
    assert not F._capturing_unchecked(spec, 3, cuda)


def test_never_compared_inside_capture(monkeypatch):
    """The comparison copies to the host, which a capture forbids: inside one, a configuration
    compared before (vLLM's eager warm-up) is launched without comparing."""
    monkeypatch.undo()  # the real _compare_now
    key = ("cuda", 64, False, False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not F._compare_now(key)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert F._compare_now(key) and not F._compare_now(("cpu",) + key[1:])
    monkeypatch.setattr(F, "_settled", {key})
    assert not F._compare_now(key)


def _replay_step(spec, rows, hidden):
    """One draft step as the patch runs it: the fused path, else vLLM's loop."""
    return F.sample_sequential(spec, rows, hidden) or R.vllm_sample_sequential()(spec, rows, hidden)


@pytest.mark.parametrize(
    "rows,temp",
    [(1, 0.6), (1, 0.0), (2, 0.0), (2, 1.0), (4, 1.0)],
    ids=["1-row-below-1", "1-row-greedy", "2-rows-greedy", "2-rows-all-at-1", "4-rows-all-at-1"],
)
def test_the_probe_runs_every_temperature_path_a_replay_may_take(rows, temp, monkeypatch):
    """vLLM's warm-up before it captures a sampled configuration has every row inert, so the
    probe's live rows are all that is compared before the graph's replays, which are never
    compared. Each temperature path of the step kernel must be among them: a row below 1 (the
    division), a live temperature-0 request (an argmax whose logits are cached), and a tile whose
    rows are all at 1 (no division at all, vLLM's default temperature), whatever the batch's
    size. Kernels wrong only on the path that ``temp`` takes are caught at the warm-up, so a
    replay of a live batch at ``temp`` is vLLM's (before: a 1-row probe ran temperature 1 only,
    2 rows 1 and 0.6, and a batch of 4 never had a tile all at 1)."""

    def takes_the_path(spec):
        idx = spec.sample_idx_mapping[: rows * 3].view(rows, 3)[:, 0]
        if not bool((idx >= 0).all()):
            return False
        t = spec.temperature[idx]
        return bool((t == 1.0).all()) if temp == 1.0 else bool((t == temp).any())

    def launch(spec, *args, **kwargs):
        REAL_LAUNCH(spec, *args, **kwargs)
        if takes_the_path(spec):
            _next_token(spec)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=700, rows=rows, n_spec=3, temps=(temp,), inert=1.0, seed=92)
    took, ref, out = R.run_both(spec, rows, hidden, _replay_step, fused_only=False)  # warm-up
    assert took is not False and torch.equal(ref["tokens"], out["tokens"])
    # The graph's replays, never compared, of a live batch at ``temp``.
    monkeypatch.setattr(F, "_compare_now", lambda key: False)
    spec.sample_idx_mapping[: rows * 3] = torch.arange(rows).repeat_interleave(3)
    spec.temperature[:rows] = temp
    took, ref, out = R.run_both(spec, rows, hidden, _replay_step, fused_only=False)
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])
    assert F._off_reason is not None and "differed from vLLM's loop" in F._off_reason


def test_a_first_comparison_of_live_rows_at_one_temperature_runs_the_probe(monkeypatch):
    """An eager server's first batch of a sampled configuration may hold live requests all at
    one temperature (vLLM's default, 1): that comparison settles the configuration, and its
    later steps are never compared. So the first comparison runs the probe's rounds too, and
    kernels wrong only where a row divides by its temperature are caught there; a later batch
    at 0.6 is then vLLM's (before: the probe ran only when no compared row drew noise, the
    configuration settled on the batch at 1, and the batch at 0.6 took the wrong kernels)."""

    def launch(spec, *args, **kwargs):
        REAL_LAUNCH(spec, *args, **kwargs)
        idx = spec.sample_idx_mapping[: 4 * 3].view(4, 3)[:, 0]
        live = idx >= 0
        t = spec.temperature[idx.clamp(min=0)]
        if bool((live & (t != 0) & (t != 1)).any()):
            _next_token(spec)

    monkeypatch.setattr(F, "_launch", launch)
    spec, hidden = R.make_case(vocab=700, rows=4, n_spec=3, temps=(1.0,), inert=0.0, seed=93)
    took, ref, out = R.run_both(spec, 4, hidden, _replay_step, fused_only=False)
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])
    idx = spec.sample_idx_mapping[: 4 * 3].view(4, 3)[:, 0]
    spec.temperature[idx] = 0.6
    took, ref, out = R.run_both(spec, 4, hidden, _replay_step, fused_only=False)
    assert torch.equal(ref["tokens"], out["tokens"]) and torch.equal(ref["cache"], out["cache"])
    assert F._off_reason is not None and "differed from vLLM's loop" in F._off_reason
