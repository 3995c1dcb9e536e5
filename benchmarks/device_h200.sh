#!/usr/bin/env bash
# GPU tests and benchmarks on a lent NVIDIA H200 or H100 (torch and Triton there, no vLLM, no pip
# index).
#   bash benchmarks/device_h200.sh prepare   # here, once: vLLM's .py + lib + wheels -> .carry/
#   bash benchmarks/device_h200.sh run       # there (carry .carry): build sm_90, test, bench
#   bash benchmarks/device_h200.sh sanitize  # there: the top-k kernels under compute-sanitizer
#   bash benchmarks/device_h200.sh fuzz      # there: the top-k fuzz (benchmarks/fuzz_gpu.py)
# "run" writes every log and JSON under $OUT (or ./h200-out). Of vLLM's compiled parts only
# _C_stable_libtorch goes there (its top_k_per_row_decode is the benchmarks' baseline), trimmed
# to its sm_90 cubins (benchmarks/trim_fatbin.py), so the platform is pinned to
# UnspecifiedPlatform before vLLM resolves it (.carry/site/sitecustomize.py); see
# ../shared/docs/vllm-0.33-integration.md.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=.carry
# What vLLM 0.33.0's indexer and sampling modules import beyond that machine's packages.
WHEELS="pydantic==2.14.4 pydantic_core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
cbor2==6.3.0 pyzmq==27.3.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
mistral_common==1.13.1 torchcodec==0.17.0 openai==3.57.0 sniffio==1.3.1 pybase64==1.5.1
cachetools==8.0.2 msgspec==0.23.0 xgrammar==0.2.8 apache-tvm-ffi==0.1.11 fastapi==0.136.3
starlette==1.10.0 partial-json-parser==0.2.1.1.post7 llguidance==1.7.6 oss-harmony==0.0.11"

prepare() {
  local py=${PYTHON:-$HOME/.cache/dsv41-gfx942-plugin/venv-vllm-0.33.0/bin/python}
  local site; site=$("$py" -c "import vllm, pathlib; print(pathlib.Path(vllm.__file__).parents[1])")
  mkdir -p "$CARRY/vwhl" "$CARRY/site"
  "$py" benchmarks/trim_fatbin.py "$site/vllm/_C_stable_libtorch.abi3.so" "$CARRY/vllm_C.so"
  xz -T0 -6 -f "$CARRY/vllm_C.so"
  (cd "$site" && tar czf - --exclude='__pycache__' $(cd "$site" && find vllm -name '*.py') \
    vllm-0.33.0.dist-info) > "$CARRY/vllm_py.tar.gz"
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp -d "$CARRY/vwhl" $(for n in 17 24 26 27 28 31; do
      echo --platform "manylinux_2_${n}_x86_64"; done) --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 $WHEELS
  # One wheel a project: several platform tags can bring two, and pip refuses to install both.
  ls "$CARRY"/vwhl/*.whl | sort | awk -F/ '{split($NF, p, "-"); if (seen[p[1]]++) print}' | xargs -r rm
  cat > "$CARRY/site/sitecustomize.py" <<'PY'
import vllm.platforms as P
from vllm.platforms.interface import UnspecifiedPlatform

P._current_platform = UnspecifiedPlatform()
PY
  du -sh "$CARRY"
}

setup() {
  out=${OUT:-h200-out}
  mkdir -p "$out" /tmp/vsite
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "$CARRY"/vwhl/*.whl > "$out/pip.txt" 2>&1
  tar xzf "$CARRY/vllm_py.tar.gz" -C /tmp/vsite
  xz -dc "$CARRY/vllm_C.so.xz" > /tmp/vsite/vllm/_C_stable_libtorch.abi3.so
  export PYTHONPATH=/tmp/vsite:/tmp/site:$CARRY/site:src:tests PYTHONUNBUFFERED=1
  python3 hip/build.py --arch sm_90 --out src/dsv41_gfx942_plugin/_kernels > "$out/build.txt" 2>&1
  t="python3 -m pytest -q -p no:cacheprovider -rf -m gpu"
}

run() {
  setup
  timeout 240 $t tests/test_topk_gpu.py tests/test_indexer_gpu.py -k "not sanitizer" \
    > "$out/t_indexer.txt" 2>&1
  # About 82 s on the H200 (the memcheck test 42 s of it); 420 s leaves room for compiles.
  timeout 420 $t --noconftest tests/test_fused_markov_gpu.py tests/test_cand_logits.py \
    > "$out/t_triton.txt" 2>&1
  timeout 240 python3 benchmarks/bench_topk.py --json "$out/bench_topk.json" > "$out/bench_topk.txt" 2>&1
  timeout 90 python3 benchmarks/bench_indexer_step.py --json "$out/bench_step.json" > "$out/bench_step.txt" 2>&1
  timeout 60 python3 benchmarks/bench_cand_logits.py --json "$out/bench_cand.json" > "$out/bench_cand.txt" 2>&1
  local rows=1,8,16,32,64,128,256  # the README's Markov tables
  timeout 240 python3 benchmarks/bench_markov.py --rows $rows --iters 20 \
    --json "$out/bench_markov.json" > "$out/bench_markov.txt" 2>&1
  timeout 180 python3 benchmarks/bench_markov.py --greedy --rows $rows --iters 20 \
    --json "$out/bench_markov_greedy.json" > "$out/bench_markov_greedy.txt" 2>&1
  tail -n 3 "$out"/t_*.txt; cat "$out"/bench_*.txt
}

# Apart from "run", whose 340 s leave no room for it in one 600 s device call.
sanitize() {
  setup
  timeout 580 $t tests/test_topk_gpu.py -k sanitizer --durations=0 > "$out/t_sanitizer.txt" 2>&1
  tail -n 20 "$out/t_sanitizer.txt"
}

# The top-k fuzz for FUZZ_SECONDS (default 330: with the setup, one 600 s device call), from
# FUZZ_SEED (default benchmarks/fuzz_gpu.py's).
fuzz() {
  setup
  local secs=${FUZZ_SECONDS:-330}
  timeout $((secs + 120)) python3 benchmarks/fuzz_gpu.py --seconds "$secs" \
    ${FUZZ_SEED:+--first-seed "$FUZZ_SEED"} > "$out/fuzz.txt" 2>&1
  tail -n 20 "$out/fuzz.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  sanitize) sanitize ;;
  fuzz) fuzz ;;
  *) echo "usage: $0 prepare|run|sanitize|fuzz" >&2; exit 2 ;;
esac
