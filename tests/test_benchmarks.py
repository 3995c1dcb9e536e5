"""The GPU benchmarks where they cannot time anything: one line saying why, not a traceback
from deep inside torch; and every benchmark runs this checkout's code."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GPU_BENCHMARKS = ["bench_topk", "bench_indexer_step", "bench_cand_logits", "bench_markov",
                  "fuzz_gpu"]  # fmt: skip


def load(name: str, monkeypatch):
    """``benchmarks/<name>.py`` as a module, with ``benchmarks/`` and ``src/`` on the path its
    imports need (undone after the test)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    spec = importlib.util.spec_from_file_location(
        f"_{name}_test", ROOT / "benchmarks" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def timing(monkeypatch):
    return load("_timing", monkeypatch)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
@pytest.mark.parametrize("name", GPU_BENCHMARKS)
def test_gpu_benchmark_without_a_gpu_says_so(name):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py")], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"{name}.py: needs a CUDA or ROCm GPU; torch {torch.__version__} sees none"
    )


def test_missing_code_object_names_the_build_command(timing, monkeypatch, tmp_path):
    from dsv41_gfx942_plugin.ops import _launcher, topk

    monkeypatch.setattr(topk, "build", lambda: False)
    monkeypatch.setattr(_launcher, "code_object_arch", lambda device=None: "gfx942")
    monkeypatch.setattr(_launcher, "KERNEL_DIR", tmp_path)
    with pytest.raises(SystemExit) as exc:
        timing.require_topk_kernels("bench_topk.py")
    assert str(exc.value) == (
        f"bench_topk.py: no top-k code object for gfx942 ({tmp_path / 'topk512.gfx942.co'} is "
        "missing); build this checkout's: python hip/build.py --arch gfx942"
    )
    (tmp_path / "topk512.gfx942.co").write_bytes(b"")  # there, but it did not load
    with pytest.raises(SystemExit, match="do not load on this GPU"):
        timing.require_topk_kernels("bench_topk.py")


def test_benchmarks_run_this_checkout(timing, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    timing.use_checkout()
    assert sys.path[:2] == [str(ROOT / "src"), str(ROOT / "tests")]


@pytest.mark.parametrize("name", [*GPU_BENCHMARKS, "bench_host"])
def test_each_benchmark_imports_this_checkouts_plugin(name):
    """Each benchmark, loaded as a script is (its folder first on the path, no PYTHONPATH; as
    CI runs with the built wheel installed), imports the plugin from this checkout's src/, not
    an installed wheel, whether it imports it as it loads or later in ``main``: it calls
    ``use_checkout`` before its first import of it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "runpy.run_path(sys.argv[2], run_name='loaded'); "
        "import dsv41_gfx942_plugin as p; print(p.__file__)"
    )  # as main's lazy imports
    bench = ROOT / "benchmarks"
    proc = subprocess.run([sys.executable, "-c", code, str(bench), str(bench / f"{name}.py")],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert Path(proc.stdout.strip().splitlines()[-1]).parent == ROOT / "src/dsv41_gfx942_plugin"


@pytest.mark.parametrize(
    ("device", "tbps"),
    [("NVIDIA H200", 4.8), ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0),
     ("NVIDIA H100 NVL", 3.9), ("AMD Instinct MI300X", 5.3), ("AMD Instinct MI325X", 6.0),
     ("NVIDIA A100", None)],
)  # fmt: skip
def test_markov_floor_takes_the_gpus_bandwidth(monkeypatch, device, tbps):
    """The Markov benchmark's memory floor divides by this GPU's peak bandwidth (once the H200's
    on every GPU), none for a GPU it does not know; --hbm-tbps names it."""
    bench = load("bench_markov", monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: device)
    assert bench.hbm_bytes_per_s(None) == (tbps and tbps * 1e12)
    assert bench.hbm_bytes_per_s(7.0) == 7.0e12


@pytest.mark.parametrize(
    ("rows", "greedy", "tbps", "floor"),
    [(1, False, 4.8, 69.5), (1, False, 3.35, 99.6), (256, False, 3.35, 296.4),
     (1, True, 3.35, 99.2), (256, True, 3.35, 197.6)],
)  # fmt: skip
def test_markov_floor_figures(monkeypatch, rows, greedy, tbps, floor):
    """The floor of 5 steps over DSv4.1's vocabulary and rank: the bias table once a step, and
    each row's base logits read (and, sampled, its draft-logits cache written). The README's
    1-row H200 floor, and those the H100 run of 6ed2cc0 printed (benchmarks/topk_sweeps.md)."""
    bench = load("bench_markov", monkeypatch)
    assert round(bench.floor_us(rows, 129280, 256, 5, greedy, tbps * 1e12), 1) == floor


@pytest.mark.parametrize("greedy", [False, True])
def test_markov_run_divides_by_this_gpus_bandwidth(monkeypatch, tmp_path, greedy):
    """``main`` as a run on an H100 goes (every timing stubbed): its floor and JSON take the
    H100's 3.35 TB/s, then ``--hbm-tbps``'s figure; a wiring slip (the H200's 4.8 TB/s on every
    GPU, as once) fails here, not only on a GPU."""
    bench = load("bench_markov", monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(bench, "require_gpu", lambda name: None)
    monkeypatch.setattr(bench, "vllm_loop", lambda: ("stub", print))
    monkeypatch.setattr(bench, "_state", lambda args, rows: (None, None, None, None))
    monkeypatch.setattr(bench, "mean_us", lambda fn, iters: 1.0)
    monkeypatch.setattr(bench, "graphed", lambda fn: fn)
    monkeypatch.setattr(bench.floors, "stream", lambda *a: None)
    monkeypatch.setattr(bench.floors, "noise", lambda *a: None)
    monkeypatch.setattr(bench.in_tree, "runner", lambda *a: None)
    for extra, tbps in (([], 3.35), (["--hbm-tbps", "2.5"], 2.5)):
        out = tmp_path / "markov.json"
        argv = ["bench_markov.py", "--rows", "8", "--json", str(out), *(["--greedy"] * greedy)]
        monkeypatch.setattr(sys, "argv", argv + extra)
        bench.main()
        run = json.loads(out.read_text())
        assert run["hbm_bytes_per_s"] == tbps * 1e12
        want = bench.floor_us(8, 129280, 256, 5, greedy, tbps * 1e12)
        assert run["results"][0]["floor_us"] == pytest.approx(want, rel=1e-12)


def test_markov_sweep_reports_a_configuration_that_does_not_fit(monkeypatch, capsys):
    """On gfx942 (64 KiB of LDS a workgroup) the sweep's BV 256 entries need 70-78 KiB and
    Triton refuses them at launch: the sweep says so and times the rest, not a traceback."""
    from triton.runtime.errors import OutOfResources

    bench = load("bench_markov", monkeypatch)
    monkeypatch.setattr(bench, "_state", lambda args, rows: (None, None, None, None))
    monkeypatch.setattr(bench, "graphed", lambda fn: fn)

    def mean_us(fn, iters):
        if fn.args[-1]["BV"] == 256:
            raise OutOfResources(72 * 1024, 64 * 1024, "shared memory")
        return 1.0

    monkeypatch.setattr(bench, "mean_us", mean_us)
    args = bench.argparse.Namespace(sweep="8", vocab=129280, rank=256, iters=1, greedy=True)
    found = bench.sweep(args)
    assert len(found) == len(bench.GREEDY_SWEEP)
    assert [r["us"] is None for r in found] == [r["BV"] == 256 for r in found]
    refused = [r for r in found if r["us"] is None]
    assert refused and all("shared memory" in r["error"] for r in refused)
    assert "{'BV': 256}: does not fit" in capsys.readouterr().out


def test_trim_fatbin_keeps_only_sm90_cubins(monkeypatch):
    """The library carried to the H100/H200 for vLLM's top-k baseline: every byte outside the
    fat binary as it was, the sm_90 cubins as they were, everything else of the fat binary
    zero (checked on vLLM 0.33.0's own library)."""
    import vllm

    trim_fatbin = load("trim_fatbin", monkeypatch)
    lib = Path(vllm.__file__).parent / "_C_stable_libtorch.abi3.so"
    original = lib.read_bytes()
    data = bytearray(original)
    kept, zeroed = trim_fatbin.trim(data, 90)
    start, size = trim_fatbin.section(original, b".nv_fatbin")
    assert len(data) == len(original)
    assert data[:start] == original[:start] and data[start + size :] == original[start + size :]
    assert kept and 5 * sum(n for _, n in kept) < zeroed
    assert all(data[at : at + n] == original[at : at + n] for at, n in kept)
    fat, before = data[start : start + size], original[start : start + size]
    assert all(
        a == b or a == 0 for a, b in zip(fat, before, strict=True)
    )  # the rest as it was, or zero
    for at, n in kept:
        fat[at - start : at - start + n] = bytes(n)
    # Zero indeed, headers aside (13.5 kB nonzero; ``zeroed`` is only what trim() reports).
    assert len(fat) - fat.count(0) < 1 << 16


@pytest.mark.parametrize(
    "entry_header, payload, length_extra",
    [(0, 0, 0), (32, 64, 0), (32, 0, 8)],
    ids=["no progress", "payload past the container", "container past the section"],
)
def test_trim_fatbin_refuses_a_malformed_fat_binary(monkeypatch, entry_header, payload,
                                                    length_extra):  # fmt: skip
    """A malformed container or entry stops the trim with a line saying where, neither looping
    forever nor zeroing (or growing) bytes outside it."""
    import struct

    trim_fatbin = load("trim_fatbin", monkeypatch)
    entry = struct.pack("<HHIQ", 2, 0, entry_header, payload) + bytes(16)
    head = struct.pack("<IHHQ", trim_fatbin.FATBIN_MAGIC, 1, 16, len(entry) + length_extra)
    data = bytearray(head + entry)
    monkeypatch.setattr(trim_fatbin, "section", lambda data, name: (0, len(data)))
    with pytest.raises(SystemExit, match="malformed fat binary"):
        trim_fatbin.trim(data, 90)
    assert data == head + entry
