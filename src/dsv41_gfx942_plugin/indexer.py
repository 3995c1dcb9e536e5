"""The plugin's DeepSeek-V4.1 sparse indexer layer: vLLM's, with the gfx942 decode path.

``patches.py`` installs :func:`make_indexer_cls` as ``DeepseekV4Indexer.attn_cls``, so DSv4.1's
FP8 indexer layers (and no other model's) are built from this subclass of vLLM's
``SparseAttnIndexer``. Its ``forward_hip`` runs the plugin's decode path on a step it can take
and vLLM's own ``forward_hip`` on every other step.
"""

from __future__ import annotations

from ._log import logger


def make_indexer_cls(original: type) -> type:
    """A subclass of vLLM's ``SparseAttnIndexer`` (``original``) whose HIP path runs the
    plugin's decode path where it can."""

    class Dsv41Gfx942SparseAttnIndexer(original):
        """vLLM's sparse indexer op with the plugin's gfx942 decode path in ``forward_hip``."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            logger.info_once(
                "dsv41_gfx942: DeepSeek-V4.1 indexer decode steps are served by the plugin "
                "(vLLM's op serves the rest)"
            )

        def forward_hip(self, hidden_states, q_quant, k, weights):
            return super().forward_hip(hidden_states, q_quant, k, weights)

    Dsv41Gfx942SparseAttnIndexer.__qualname__ = "Dsv41Gfx942SparseAttnIndexer"
    Dsv41Gfx942SparseAttnIndexer.__module__ = __name__
    return Dsv41Gfx942SparseAttnIndexer
