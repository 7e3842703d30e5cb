#!/usr/bin/env bash
# The one script a GPU window runs (issue 32), from the repo root, inside 15 minutes of device
# time, machine start and transfer included. Prepare here first (nothing is built there):
#   scripts/gpu_prepare.sh                       # .device/: sm_90 binaries + libraries, < 64 MiB
#   run(command="scripts/gpu_check.sh", carry=[".device"], timeout_s=570)
#   scripts/gpu_check.sh --dry-run               # here / CI: every stage that needs no GPU
# Stages, in the order the numbers matter; each is bounded (timeout -k), logs under $OUT as it
# goes, and a failing stage is reported while the next one runs:
#   env        GPU, driver, the carried binaries' libraries (ldd), libcublas.so.13 opens
#   smoke      one prefill pass and a decode run: CUDA logits finite and equal to the CPU's
#   bench      tandem bench pp512 / tg128: Llama-1B Q4_0, F16; Llama-8B Q4_0, F16
#   serve      bench/serve_bench.py at 16 and 64 streams on `tandem serve --device cuda`
#   tests      every CUDA test in its own process (--gtest_list_tests), so one abort costs one
#              test; then the CUDA pass against scripts/gpu/torch_reference.py's PyTorch float32
#              logits (CudaForward.MatchesTorchReference), where torch and the carried gguf are
#   sanitizer  compute-sanitizer memcheck on a short test subset and a short decode run
# Models are random-weight GGUFs written there in seconds (scripts/gpu/make_model.py).
# Comes back (the tool returns at most 8 files): summary.txt (the table), results.tsv, env.log,
# smoke.log, bench.log, serve.log, tests.log, sanitizer.log.
# Carried binaries that are missing or do not start fall back to a build there (a last resort:
# it needs the build dependencies on the image, and takes ~4 of the 15 minutes).
# A stage's command may print "FIGURES ..." lines: the last one lands in its row of the table.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET=${BUDGET:-$([ $DRY = 1 ] && echo 300 || echo 540)}  # seconds; a stage past it is skipped
CARRY=${CARRY:-.device}
MODELS=${MODELS:-$([ $DRY = 1 ] && echo "$OUT/models" || echo /tmp/tandem-models)}
SUMMARY=$OUT/summary.txt
RESULTS=$OUT/results.tsv
DEVICE=cuda
[ $DRY = 1 ] && DEVICE=cpu  # the dry run drives every stage on the CPU
: >"$SUMMARY"
: >"$RESULTS"
mkdir -p "$MODELS"

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - SECONDS)); }
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RESULTS"; }  # stage, status, seconds, figures
# run_stage NAME LOG LIMIT cmd...: runs it under timeout -k, appends to LOG, adds a row.
run_stage() {
  local name=$1 log=$2 limit=$3 t0=$SECONDS rc status from
  shift 3
  touch "$log"
  from=$(($(wc -l <"$log") + 1))
  if [ "$(left)" -lt 15 ]; then
    row "$name" SKIPPED 0 "time budget spent"
    echo "== $name: SKIPPED (budget)" >>"$log"
    return 1
  fi
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  echo "== $name ($(date -u +%T))" >>"$log"
  # Through bash -c, so a stage may be one of this script's functions (exported below).
  timeout -k 5 "$limit" bash -o pipefail -c '"$@"' stage "$@" >>"$log" 2>&1
  rc=$?
  status=ok
  [ $rc -ne 0 ] && status="FAILED rc=$rc"
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && status="TIMEOUT ${limit}s"
  local figures
  figures=$(tail -n "+$from" "$log" | grep -a '^FIGURES ' | tail -n 1 | cut -d' ' -f2-)
  # A failure without figures shows its last words (the log has the rest).
  [ $rc -ne 0 ] && [ -z "$figures" ] &&
    figures=$(tail -n "+$((from + 1))" "$log" | grep -av '^\s*$' | tail -n 1 | tr -d '|\t' | cut -c1-160)
  echo "== $name: $status in $((SECONDS - t0)) s" >>"$log"
  row "$name" "$status" $((SECONDS - t0)) "$figures"
  return $rc
}

say "tandem gpu_check $(git rev-parse --short HEAD 2>/dev/null) $(date -u +%FT%TZ)$([ $DRY = 1 ] && echo ' (dry run: cpu)')"

# ---- env: the GPU, the carried binaries and their libraries, cuBLAS ----
ENV_LOG=$OUT/env.log
{
  echo "uname: $(uname -a)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 |
      sed 's/^/gpu: /'
  else
    echo "gpu: none (no nvidia-smi)"
  fi
  echo "python: $(python3 -c 'import numpy; print("numpy", numpy.__version__)' 2>&1)"
  echo "compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo none)"
  sed 's/^/carried: /' "$CARRY/manifest.txt" 2>/dev/null
} >>"$ENV_LOG" 2>&1
grep -E "^gpu:" "$ENV_LOG" | tee -a "$SUMMARY"

# libcublas.so.13 is the image's (54 MB + 542 MB of cuBLASLt: not carried); the first folder
# that has it goes on LD_LIBRARY_PATH, where tandem's dlopen finds it.
CUBLAS_DIR=""
for d in $(ldconfig -p 2>/dev/null | awk '/libcublas\.so\.13 /{print $NF}' | xargs -r -n1 dirname) \
  /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null); do
  [ -e "$d/libcublas.so.13" ] && CUBLAS_DIR=$d && break
done
if [ $DRY = 1 ] && [ ! -d "$CARRY/bin" ]; then  # the dry run assembles what a window would carry
  CARRY=$OUT/carry
  DEST=$CARRY run_stage "env: assemble the carried files" "$ENV_LOG" 60 scripts/gpu_prepare.sh --no-build
fi
CARRY=$(cd "$CARRY" 2>/dev/null && pwd || echo "$CARRY")
# libnccl.so.2 (218 MB, not carried either; tandem_cuda_tests links it): the image's, the same way.
NCCL_DIR=""
for d in $(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF}' | xargs -r -n1 dirname) /usr/local/cuda/lib64 /usr/local/cuda/lib \
  $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); do
  [ -e "$d/libnccl.so.2" ] && NCCL_DIR=$d && break
done
export LD_LIBRARY_PATH="$CARRY/lib${CUBLAS_DIR:+:$CUBLAS_DIR}${NCCL_DIR:+:$NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run_stage "env: libcublas.so.13 opens" "$ENV_LOG" 20 \
  python3 -c 'import ctypes, sys; ctypes.CDLL("libcublas.so.13"); print("FIGURES from", sys.argv[1])' "${CUBLAS_DIR:-nowhere}"

BIN=$CARRY/bin
bins_ok() {  # every carried binary resolves its libraries and starts
  local b
  for b in tandem tandem_cuda_tests tandem_tests tandem_backend_tests tandem_cuda_matmul_bench; do
    [ -x "$BIN/$b" ] || { echo "missing $BIN/$b"; return 1; }
    if ldd "$BIN/$b" | grep -q "not found"; then
      ldd "$BIN/$b" | grep "not found" | sed "s#^#$b: #"
      return 1
    fi
  done
  "$BIN/tandem" --help >/dev/null && "$BIN/tandem_cuda_tests" --gtest_list_tests >/dev/null &&
    echo "FIGURES $(du -sh "$BIN" | cut -f1) of binaries, $(du -sh "$CARRY/lib" | cut -f1) of libraries"
}
export -f bins_ok
export BIN CARRY
if ! run_stage "env: carried binaries start" "$ENV_LOG" 30 bins_ok && [ $DRY = 0 ]; then
  BUILD=${BUILD:-build-gpu}
  run_stage "env: fallback build (configure)" "$ENV_LOG" 90 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 &&
    run_stage "env: fallback build" "$ENV_LOG" 300 cmake --build "$BUILD" -j16 --target tandem tandem_cuda_tests \
      tandem_tests tandem_backend_tests tandem_cuda_matmul_bench
  BIN=$OUT/.bin
  mkdir -p "$BIN"
  for b in tandem tests/tandem_cuda_tests tests/tandem_tests tests/tandem_backend_tests bench/tandem_cuda_matmul_bench; do
    [ -x "$BUILD/$b" ] && ln -sf "$PWD/$BUILD/$b" "$BIN/"
  done
fi
TANDEM=$BIN/tandem
export TANDEM DEVICE MODELS BIN

# ---- models: written in seconds each (make_model.py tiles a pool of valid random blocks) ----
make_model() {  # make_model SHAPE TYPE: $MODELS/SHAPE-TYPE.gguf, written once
  local f=$MODELS/$1-$2.gguf t0=$SECONDS
  [ -s "$f" ] && return 0
  python3 scripts/gpu/make_model.py "$f.tmp" "$1" "$2" && mv "$f.tmp" "$f" &&
    echo "FIGURES $(du -h "$f" | cut -f1) written in $((SECONDS - t0)) s"
}

# ---- smoke: one pass, logits finite and equal to the CPU's ----
SMOKE_LOG=$OUT/smoke.log
compare_logits() {  # compare_logits MODEL MODE: the device's logits (the dry run: the CPU's again) vs the CPU's
  local m=$1 mode=$2 toks="1 300 31 5 402 77 18 260 9 133 47 380 26 301 8 55 120 64 3 290"
  "$TANDEM" logits -m "$m" --tokens "$toks" --mode "$mode" --device cpu -o "$MODELS/ref.bin" &&
    "$TANDEM" logits -m "$m" --tokens "$toks" --mode "$mode" --device "$DEVICE" -o "$MODELS/got.bin" &&
    python3 - "$MODELS/ref.bin" "$MODELS/got.bin" <<'PY'
import sys
import numpy as np
ref, got = (np.fromfile(p, dtype="<f4") for p in sys.argv[1:3])
assert ref.size == got.size and ref.size % 20 == 0, f"sizes {ref.size} vs {got.size}"
ref, got = ref.reshape(20, -1), got.reshape(20, -1)
finite = bool(np.isfinite(got).all())
scale = max(1.0, float(np.abs(ref).max()))
worst = float(np.abs(got - ref).max()) / scale
top1 = float((got.argmax(1) == ref.argmax(1)).mean())
# A different top-1 counts only where the reference's own top two are further apart than the
# tolerance (random weights leave near-ties that 8-bit activations may order either way).
rows = np.arange(ref.shape[0])
near = ref[rows, got.argmax(1)] >= ref.max(1) - 2e-2 * scale
print(f"FIGURES finite {finite}, worst diff {worst:.2e} of the logits' scale {scale:.3g}, same top-1 {top1:.0%}"
      f" ({near.mean():.0%} within the tolerance)")
sys.exit(0 if finite and worst <= 2e-2 and near.all() else 1)
PY
}
export -f make_model compare_logits
SMOKE_MODELS=("tiny f16" "tiny q4_0" "smollm2-135m q4_0")
[ $DRY = 1 ] && SMOKE_MODELS=("tiny f16" "tiny q4_0")  # the CPU-against-CPU mechanics, quickly
for spec in "${SMOKE_MODELS[@]}"; do
  read -r shape type <<<"$spec"
  make_model "$shape" "$type" >>"$SMOKE_LOG" 2>&1
  for mode in prefill decode; do
    run_stage "smoke $shape $type $mode" "$SMOKE_LOG" 60 compare_logits "$MODELS/$shape-$type.gguf" "$mode"
  done
done

# ---- bench: pp512 / tg128 where llama.cpp's figures are (../shared/README.md) ----
BENCH_LOG=$OUT/bench.log
bench() {  # bench MODEL: tandem bench's JSON into the log, its figures as one line
  "$TANDEM" bench -m "$1" --device "$DEVICE" -p "$P" -n "$N" -r "$R" --json >"$MODELS/bench.json" || return 1
  cat "$MODELS/bench.json"
  python3 - "$MODELS/bench.json" <<'PY'
import json, math, sys
j = json.load(open(sys.argv[1]))
pp, tg = (next(v for k, v in j.items() if k.startswith(p) and isinstance(v, dict)) for p in ("pp", "tg"))
print(f"FIGURES pp {pp['tok_s']:.1f} tok/s ({pp['gflop_s'] / 1e3:.2f} TFLOP/s), tg {tg['tok_s']:.1f} tok/s "
      f"({tg['gb_s']:.0f} GB/s)")
sys.exit(0 if all(math.isfinite(x["tok_s"]) and x["tok_s"] > 0 for x in (pp, tg)) else 1)
PY
}
if [ $DRY = 1 ]; then
  P=16 N=4 R=1 BENCH_MODELS="tiny-q4_0 smollm2-135m-q4_0"
else
  P=512 N=128 R=3 BENCH_MODELS="llama-1b-q4_0 llama-1b-f16 llama-8b-q4_0 llama-8b-f16"
fi
export -f bench
export P N R
for name in $BENCH_MODELS; do
  run_stage "model $name" "$BENCH_LOG" 120 make_model "${name%-*}" "${name##*-}" &&
    run_stage "bench $name pp$P tg$N" "$BENCH_LOG" 150 bench "$MODELS/$name.gguf"
  [ "$name" = llama-8b-f16 ] && rm -f "$MODELS/$name.gguf"  # 16 GB of disk back
done

# ---- serve: total tok/s at 16 and 64 streams ----
SERVE_LOG=$OUT/serve.log
if [ $DRY = 1 ]; then
  SERVE_MODELS="tiny-q4_0" STREAMS=16 TOKENS=8
else
  SERVE_MODELS="llama-1b-q4_0 llama-1b-f16" STREAMS=16,64 TOKENS=128
fi
serve() {  # serve MODEL: serve_bench.py's lines, then its figures as one line
  python3 bench/serve_bench.py --model "$1" --tandem "$TANDEM" --device "$DEVICE" --streams "$STREAMS" \
    --tokens "$TOKENS" --kv-memory 8GiB --no-prefix --rounds 1 2>&1 | tee "$MODELS/serve.txt"
  local rc=${PIPESTATUS[0]}
  echo "FIGURES $(grep -E '^round 1 tandem +[0-9]+ streams' "$MODELS/serve.txt" | sed -E 's/^round 1 tandem +//; s/, mean TTFT +/, TTFT /' |
    paste -sd';')"
  return "$rc"
}
export -f serve
export STREAMS TOKENS
for name in $SERVE_MODELS; do
  make_model "${name%-*}" "${name##*-}" >>"$SERVE_LOG" 2>&1
  run_stage "serve $name, $STREAMS streams x $TOKENS tokens" "$SERVE_LOG" 180 serve "$MODELS/$name.gguf"
done

# ---- tests: one process per test ----
TESTS_LOG=$OUT/tests.log
one_by_one() {  # one_by_one BINARY FILTER: each listed test alone, bounded
  local bin=$1 filter=$2 t rc pass=0 fail=0 skip=0 failed=""
  while read -r t; do
    echo "-- $t"
    timeout -k 5 120 "$bin" --gtest_filter="$t" >"$MODELS/test.txt" 2>&1
    rc=$?
    cat "$MODELS/test.txt"
    if [ $rc -ne 0 ]; then
      fail=$((fail + 1))
      failed+=" $t(rc=$rc)"
    elif grep -q "^\[  SKIPPED \]" "$MODELS/test.txt"; then
      skip=$((skip + 1))
    else
      pass=$((pass + 1))
    fi
  done < <("$bin" --gtest_list_tests --gtest_filter="$filter" | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}')
  echo "FIGURES $pass passed, $fail failed, $skip skipped${failed:+; failed:$failed}"
  [ $fail -eq 0 ] && [ $((pass + skip)) -gt 0 ]
}
export -f one_by_one
for spec in "tandem_cuda_tests *" "tandem_tests CudaMatmul*" "tandem_backend_tests *"; do
  read -r binary filter <<<"$spec"
  run_stage "tests $binary $filter" "$TESTS_LOG" 300 one_by_one "$BIN/$binary" "$filter"
done

# The independent reference: PyTorch's float32 forward pass of the same GGUF (torch_reference.py
# reads it with the carried gguf package), the CUDA pass against its logits.
torch_check() {  # torch_check MODEL: writes the reference, then the test reads it
  local ref=$MODELS/ref-$(basename "$1" .gguf)
  PYTHONPATH="$CARRY/python${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/gpu/torch_reference.py "$1" "$ref" 64 &&
    TANDEM_TORCH_REF=$ref "$BIN/tandem_cuda_tests" --gtest_filter=CudaForward.MatchesTorchReference | tee "$MODELS/torch.txt" &&
    echo "FIGURES $(grep -a '^\[ vs torch \]' "$MODELS/torch.txt" | cut -d']' -f2- | tail -n 1)" &&
    ! grep -q "^\[  SKIPPED \]" "$MODELS/torch.txt"
}
export -f torch_check
if [ $DRY = 0 ] && PYTHONPATH="$CARRY/python" python3 -c 'import torch, gguf' >/dev/null 2>&1; then
  for name in tiny-f16 smollm2-135m-q4_0; do
    run_stage "torch reference $name" "$TESTS_LOG" 120 torch_check "$MODELS/$name.gguf"
  done
else
  row "torch reference" SKIPPED 0 "$([ $DRY = 1 ] && echo 'dry run' || echo 'no torch or no carried gguf')"
fi

# ---- compute-sanitizer on a short run ----
SAN_LOG=$OUT/sanitizer.log
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$SAN" ] && [ $DRY = 0 ]; then
  run_stage "sanitizer memcheck (tests)" "$SAN_LOG" 150 "$SAN" --tool memcheck --error-exitcode 9 \
    "$BIN/tandem_cuda_tests" \
    --gtest_filter='CudaBackend.StoreKv*:CudaBackend.AttentionMatchesCpu*:CudaBackend.Logits*:CudaForward.LogitsEqualCpuForEveryKvType'
  run_stage "sanitizer memcheck (decode)" "$SAN_LOG" 90 "$SAN" --tool memcheck --error-exitcode 9 "$TANDEM" run \
    -m "$MODELS/tiny-q4_0.gguf" -p "abc abc" -n 24 --temp 0 --device cuda
else
  row "sanitizer" SKIPPED 0 "$([ $DRY = 1 ] && echo 'dry run' || echo 'no compute-sanitizer')"
  echo "sanitizer: skipped" >>"$SAN_LOG"
fi

# ---- the summary table ----
{
  echo
  echo "| stage | status | s | figures |"
  echo "| --- | --- | ---: | --- |"
  awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' "$RESULTS"
  echo
  echo "gpu_check: done in $SECONDS s; stages failed: $(grep -cE $'\t(FAILED|TIMEOUT)' "$RESULTS")"
} | tee -a "$SUMMARY"
rm -rf "$OUT/.bin" "$MODELS/ref.bin" "$MODELS/got.bin" "$MODELS/test.txt"
[ $DRY = 1 ] && rm -rf "$MODELS" "$OUT/carry"
! grep -qE $'\t(FAILED|TIMEOUT)' "$RESULTS"
