"""vLLM 0.33.0's own gfx942 fused Markov sampling (``vllm/models/deepseek_v41/amd/ops/
fused_markov.py``, on only with ``--monokernel`` on gfx942), run as a second baseline for
``bench_markov.py``. The plugin neither imports nor launches it; this benchmark does, to say how
the plugin compares with what ``--monokernel`` gives (sampled drafts of at most 8 requests, the
only ones it takes).

Its package's ``__init__`` imports the whole DeepSeek-V4.1 model, which needs vLLM's compiled
parts (absent on the H200), so the file is loaded by path with its one import from that package
(``enabled``, its ``--monokernel``-on-gfx942 switch) stood in by ``True`` for the load alone; its
own ``sample_sequential`` then runs as vLLM ships it, on a speculator namespace carrying what it
reads. A plain Triton kernel, so an NVIDIA GPU runs it too.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path

import torch

PACKAGE = "vllm.models.deepseek_v41.amd.ops"
MAX_ROWS = 8  # the in-tree module's MAX_ROWS: larger batches take vLLM's loop there


class UnquantizedEmbeddingMethod:
    """Named as vLLM's unquantized embedding method, which the in-tree ``_why_not`` asks for."""


@functools.cache
def _load():
    """The in-tree module, or None (with the reason printed) where it cannot be loaded; tried
    once a process."""
    try:
        import vllm

        path = Path(vllm.__file__).parent / "models/deepseek_v41/amd/ops/fused_markov.py"
        spec = importlib.util.spec_from_file_location("_vllm_in_tree_fused_markov", path)
        module = importlib.util.module_from_spec(spec)
        names = ("vllm.models.deepseek_v41", "vllm.models.deepseek_v41.amd", PACKAGE)
        saved = {name: sys.modules.get(name) for name in names}
        stubs = {name: types.ModuleType(name) for name in names}
        stubs[PACKAGE].enabled = lambda: True
        sys.modules.update(stubs)
        try:
            spec.loader.exec_module(module)
        finally:
            for name, old in saved.items():
                if old is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = old
        return module
    except Exception as e:  # another vLLM, or its layout moved
        print(f"vLLM's in-tree fused Markov sampling unavailable ({e!r})")
        return None


def runner(spec, rows: int, base3: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):
    """A callable running the in-tree fused sampling of ``rows`` requests on ``bench_markov``'s
    speculator state (the same outputs, ``draft_tokens`` and ``draft_logits``), or None where it
    does not take the step (greedy drafts, more than 8 rows, not loadable)."""
    if spec.draft_logits is None or not 1 <= rows <= MAX_ROWS:
        return None
    module = _load()
    if module is None:
        return None
    n_spec, vocab = base3.shape[1], base3.shape[2]
    head = types.SimpleNamespace(
        markov_w1=types.SimpleNamespace(weight=w1),
        markov_w2=types.SimpleNamespace(weight=w2, quant_method=UnquantizedEmbeddingMethod()),
    )
    flat = base3.reshape(rows * n_spec, vocab)
    state = types.SimpleNamespace(
        **vars(spec),
        model=types.SimpleNamespace(
            model=types.SimpleNamespace(markov_head=head), compute_draft_logits=lambda h: flat
        ),
        draft_watermarker=None,
        _d2t_scatter_index=None,
        use_confidence_head=False,
        acceptance_estimator=None,
        sample_indices=torch.arange(rows * n_spec, device=base3.device),
    )
    # No hidden features: the gather of the sampled rows' hidden states launches nothing, so
    # what is timed is the in-tree launches alone, as the plugin's side times its own.
    hidden = torch.empty(rows * n_spec, 0, device=base3.device)
    if module._why_not(state, rows) is not None:
        return None

    def run():
        assert module.sample_sequential(state, rows, hidden)

    return run
