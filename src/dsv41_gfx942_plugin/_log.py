"""The plugin's one logger, a child of vLLM's: records go through vLLM's handler and format,
follow ``VLLM_LOGGING_LEVEL``, and have vLLM's ``info_once``/``warning_once``/``debug_once``.
"""

from vllm.logger import init_logger

#: Under "vllm" so vLLM's logging configuration applies ("vllm" does not propagate to the root).
LOGGER_NAME = "vllm.plugins.dsv41_gfx942"

logger = init_logger(LOGGER_NAME)

#: Warned once a process (:func:`warn_markov_out_of_memory`) wherever a fused Markov step runs out
#: of GPU memory: before its base logits (speculator.py) or after them (ops/fused_markov.py).
MARKOV_OUT_OF_MEMORY = (
    "dsv41_gfx942: out of GPU memory in a fused Markov step; that step takes vLLM's loop "
    "(logged once). Under tensor parallelism the other ranks may have taken the fused path, "
    "whose drafts can differ from the loop's in a token a bias's last bit decides, and ranks "
    "with different drafts drift apart: restart with more free GPU memory or "
    "DSV41_GFX942_FUSED_MARKOV=0"
)


def warn_markov_out_of_memory() -> None:
    """Warn :data:`MARKOV_OUT_OF_MEMORY` once a process, on every rank: vLLM's ``warning_once``
    logs only on each node's first rank unless told otherwise, and running out of GPU memory is
    one rank's own condition."""
    logger.warning_once(MARKOV_OUT_OF_MEMORY, scope="process")
