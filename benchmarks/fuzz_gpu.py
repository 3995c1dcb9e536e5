"""The top-k hooks' seeded fuzz on this GPU for as long as asked, not the 2,000 cases of the
suite's ``test_fuzz``.

Seeds N, N+1, ... of 100 cases each (``tests/fuzz_topk.py``: rows of adversarial structures,
widths and ends about the kernels' branch points, every answer checked against the torch
references) until ``--seconds`` have passed; a failure stops it with the seed and the case that
reproduce it (``fuzz_topk.run(100, seed, "cuda", ...)``). It runs the kernels this checkout's
code loads: the sm_90 build on an NVIDIA H200 or H100 (``benchmarks/device_h200.sh fuzz``), the
gfx942 code object on an MI300X/MI325X. Not a benchmark: it prints how many cases passed.

    python benchmarks/fuzz_gpu.py --seconds 600
"""

from __future__ import annotations

import argparse
import time

import torch

from _timing import require_gpu, require_topk_kernels, summary, use_checkout

use_checkout()
import fuzz_topk  # noqa: E402

CASES_A_SEED = 100
# Past the seeds of the runs recorded in benchmarks/topk_sweeps.md ("GPU test runs": 9000-9762,
# 9800-14283 of fuzz_topk before its one-value and cluster rows, 14284-15387 with them), so that
# a run with the default tries new cases.
FIRST_SEED = 15388


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="start no seed after this long (default 300)")  # fmt: skip
    parser.add_argument("--first-seed", type=int, default=FIRST_SEED)
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, not {args.seconds}")
    require_gpu("fuzz_gpu.py")
    require_topk_kernels("fuzz_gpu.py")
    start, seed = time.monotonic(), args.first_seed
    while time.monotonic() - start < args.seconds:
        fuzz_topk.run(CASES_A_SEED, seed, "cuda", f"seed {seed}")
        seed += 1
    print(f"{torch.cuda.get_device_name()}: seeds {args.first_seed}-{seed - 1}, "
          f"{CASES_A_SEED * (seed - args.first_seed)} cases, no failure, "
          f"{time.monotonic() - start:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
