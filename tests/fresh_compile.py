"""The gfx942 build tests' compiles, in one fresh Python process."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def compile_all(module: str) -> dict:
    """``module._compile_all()``, run in a fresh process without the Triton interpreter, and its
    JSON result. Under ``TRITON_INTERPRET=1`` (as CI runs the suite) ``@triton.jit`` gives
    interpreted functions, which do not compile, and once a Triton kernel has run in the
    interpreter, later Gluon compiles in that process fail (triton 3.8: "'ir.value' object has
    no attribute 'dtype'")."""
    code = f"import json, {module} as t; print(json.dumps(t._compile_all()))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), *sys.path])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
