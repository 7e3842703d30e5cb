#!/usr/bin/env bash
# The one script a GPU session runs on the device machine (issue 20), from the repo root:
#   scripts/gpu_check.sh            (writes everything under $OUT, default ./gpu-out)
# Prepare first, here: scripts/gpu_prepare.sh (gguf wheel, make_gguf.py, build-dependency
# packages into .device/), then run it carrying .device, e.g.
#   run(command="scripts/gpu_check.sh", carry=[".device"], timeout_s=540)
# Stages (each bounded; a failing stage is reported and the next runs): environment, build
# (16 cores), CUDA unit tests, compute-sanitizer memcheck on a short subset, random-weight
# GGUFs (make_gguf.py, requantized by scripts/gpu/quantize_gguf.py), the PyTorch float32
# reference of a model's logits checked by the CUDA pass, `tandem bench --device cuda`.
# At most 8 files come back: summary.txt, build.log, tests.log, sanitizer.log, torch.log,
# bench.log, tests.xml.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
JOBS=${JOBS:-16}
BUILD=${BUILD:-build-gpu}
MODELS=${MODELS:-/tmp/tandem-models}
BUDGET=${BUDGET:-480}  # seconds for the whole script; later stages are skipped past it
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - SECONDS)); }
stage() {  # stage NAME TIMEOUT LOG command...: runs it, says how it ended and how long it took
  local name=$1 limit=$2 log=$3 t0=$SECONDS rc
  shift 3
  if [ "$(left)" -lt 20 ]; then say "== $name: SKIPPED (time budget spent)"; return 1; fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  echo "== $name" >>"$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  rc=$?
  say "== $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED rc=$rc$([ $rc -eq 124 ] && echo ' (timeout)')") in $((SECONDS - t0)) s"
  return $rc
}

say "tandem gpu_check $(git rev-parse --short HEAD 2>/dev/null) $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$SUMMARY"
echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 2 | head -n 1)" | tee -a "$SUMMARY"
echo "python: $(python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)' 2>&1)" | tee -a "$SUMMARY"

# Build dependencies the image may lack: unpack the carried Debian packages beside the tree.
if [ -d .device/debs ] && ls .device/debs/*.deb >/dev/null 2>&1; then
  SYSROOT=$PWD/.device/sysroot
  mkdir -p "$SYSROOT"
  for d in .device/debs/*.deb; do dpkg -x "$d" "$SYSROOT"; done
  export CMAKE_PREFIX_PATH="$SYSROOT/usr:${CMAKE_PREFIX_PATH:-}"
  export PKG_CONFIG_PATH="$SYSROOT/usr/lib/x86_64-linux-gnu/pkgconfig:$SYSROOT/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
  export PKG_CONFIG_SYSROOT_DIR=""
  export CPATH="$SYSROOT/usr/include:${CPATH:-}"
  export LIBRARY_PATH="$SYSROOT/usr/lib/x86_64-linux-gnu:${LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH="$SYSROOT/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  # The .pc files say prefix=/usr: point them at the sysroot.
  for pc in "$SYSROOT"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i "s#^prefix=/usr\$#prefix=$SYSROOT/usr#" "$pc"
  done
  say "deps: carried packages unpacked into .device/sysroot"
fi
if ! python3 -c "import gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links .device/wheels gguf >>"$OUT/build.log" 2>&1 &&
    say "python: gguf installed from .device/wheels" || say "python: NO gguf (run scripts/gpu_prepare.sh and carry .device)"
fi

stage "configure" 90 "$OUT/build.log" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
stage "build tests" 240 "$OUT/build.log" cmake --build "$BUILD" -j"$JOBS" --target tandem_cuda_tests tandem_backend_tests tandem_tests tandem_cuda_matmul_bench
TESTS=$BUILD/tests/tandem_cuda_tests
[ -x "$TESTS" ] || { say "no test binary: see build.log"; tail -n 40 "$OUT/build.log" >>"$SUMMARY"; }
# The CLI (Boost, CLI11) in the background while the tests run.
(timeout 300 cmake --build "$BUILD" -j"$JOBS" --target tandem >"$OUT/build-tandem.log" 2>&1; echo "rc=$?" >>"$OUT/build-tandem.log") &
CLI_BUILD=$!

stage "cuda tests" 150 "$OUT/tests.log" "$TESTS" --gtest_output=xml:"$OUT/tests.xml" --gtest_filter=-CudaForward.MatchesTorchReference
grep -E "^\[ (cuda vs cpu|vs torch) \]|FAILED|PASSED|SKIPPED" "$OUT/tests.log" | head -n 40 | tee -a "$SUMMARY"
stage "backend choice tests" 30 "$OUT/tests.log" "$BUILD/tests/tandem_backend_tests"
# The matrix products of every weight type against a float64 reference (tests/test_cuda_matmul.cpp).
stage "cuda matmul tests" 120 "$OUT/tests.log" "$BUILD/tests/tandem_tests" --gtest_filter='CudaMatmul*'
grep -E "^\[  (FAILED|PASSED|SKIPPED)" "$OUT/tests.log" | tail -n 6 | tee -a "$SUMMARY"
# The kernels per decode token and graph reuse, from the graph test's own counters.
stage "compute-sanitizer memcheck" 150 "$OUT/sanitizer.log" compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$TESTS" --gtest_filter='CudaBackend.StoreKv*:CudaBackend.AttentionMatchesCpu*:CudaBackend.Decode*:CudaBackend.Logits*:CudaBatchStaging.*'
tail -n 5 "$OUT/sanitizer.log" | sed 's/^/sanitizer: /' | tee -a "$SUMMARY"

# Random-weight models (F16 from make_gguf.py; quantized copies).
GEN=""
for g in ../shared/tools/make_gguf.py shared/tools/make_gguf.py .device/tools/make_gguf.py; do [ -f "$g" ] && GEN=$g && break; done
mkdir -p "$MODELS"
if [ -n "$GEN" ]; then
  stage "model smollm2-135m f16" 120 "$OUT/torch.log" python3 "$GEN" "$MODELS/smollm2-135m-f16.gguf" smollm2-135m
  stage "model smollm2-135m q4_1" 120 "$OUT/torch.log" python3 scripts/gpu/quantize_gguf.py "$MODELS/smollm2-135m-f16.gguf" "$MODELS/smollm2-135m-q4_1.gguf" Q4_1
  stage "torch reference (smollm2-135m f16)" 120 "$OUT/torch.log" python3 scripts/gpu/torch_reference.py "$MODELS/smollm2-135m-f16.gguf" "$MODELS/ref-f16" 64
  TANDEM_TORCH_REF="$MODELS/ref-f16" stage "cuda vs torch (f16)" 90 "$OUT/torch.log" "$TESTS" --gtest_filter=CudaForward.MatchesTorchReference
  stage "torch reference (smollm2-135m q4_1)" 120 "$OUT/torch.log" python3 scripts/gpu/torch_reference.py "$MODELS/smollm2-135m-q4_1.gguf" "$MODELS/ref-q4_1" 64
  TANDEM_TORCH_REF="$MODELS/ref-q4_1" stage "cuda vs torch (q4_1)" 90 "$OUT/torch.log" "$TESTS" --gtest_filter=CudaForward.MatchesTorchReference
  grep -E "^\[ vs torch \]|torch reference:" "$OUT/torch.log" | tee -a "$SUMMARY"
  [ "$(left)" -gt 200 ] && stage "model llama-1b f16" 120 "$OUT/torch.log" python3 "$GEN" "$MODELS/llama-1b-f16.gguf" llama-1b
else
  say "models: no make_gguf.py (../shared/tools, shared/tools or .device/tools): run scripts/gpu_prepare.sh"
fi

# tandem bench on the GPU (once the CLI has --device).
wait "$CLI_BUILD"
TANDEM=$BUILD/tandem
if [ -x "$TANDEM" ] && "$TANDEM" bench --help 2>&1 | grep -q -- "--device"; then
  for m in smollm2-135m-q4_1 smollm2-135m-f16 llama-1b-f16; do
    [ -f "$MODELS/$m.gguf" ] || continue
    stage "bench $m" 90 "$OUT/bench.log" "$TANDEM" bench -m "$MODELS/$m.gguf" --device cuda -p 512 -n 128 -r 3
  done
  grep -E "pp512|tg128|GB/s|TFLOP" "$OUT/bench.log" | head -n 30 | tee -a "$SUMMARY"
else
  say "bench: skipped ($([ -x "$TANDEM" ] && echo 'tandem has no --device yet' || echo 'tandem did not build: build-tandem.log'))"
  tail -n 20 "$OUT/build-tandem.log" >>"$OUT/build.log" 2>/dev/null
fi
# The products alone: decode GB/s per weight type from HBM, GEMM TFLOP/s at n = 512.
[ -x "$BUILD/bench/tandem_cuda_matmul_bench" ] && stage "matmul bench" 90 "$OUT/bench.log" "$BUILD/bench/tandem_cuda_matmul_bench" &&
  grep -E "GB/s|TFLOP" "$OUT/bench.log" | tail -n 20 | tee -a "$SUMMARY"
rm -f "$OUT/build-tandem.log"
say "gpu_check: done in $SECONDS s"
