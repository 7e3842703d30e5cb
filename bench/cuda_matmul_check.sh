#!/usr/bin/env bash
# The CUDA matmul kernels' checks and benchmark on a GPU machine, in one run (issue 20):
# build (CUDA on), the CudaMatmul* tests, compute-sanitizer memcheck over the device tests, and
# tandem_cuda_matmul_bench. Output: stdout, and $OUT/cuda_matmul_check.log when OUT is set.
# Usage: bench/cuda_matmul_check.sh [build-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
LOG=${OUT:-/tmp}/cuda_matmul_check.log
exec > >(tee "$LOG") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON >/dev/null || exit 1
cmake --build "$B" -j"$(nproc)" --target tandem_tests tandem_cuda_matmul_bench 2>&1 | grep -E "error|warning: .*cuda" || true
echo "== tests"
"$B"/tests/tandem_tests --gtest_filter='CudaMatmul*' 2>&1 | tail -25
echo "== memcheck"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 300 "$SAN" --tool memcheck --error-exitcode 9 "$B"/tests/tandem_tests \
  --gtest_filter='CudaMatmulDevice.Embed*:CudaMatmulDevice.Prepared*:CudaMatmulDevice.Plain*:CudaMatmulDevice.Graph*' 2>&1 | tail -8
echo "memcheck exit: ${PIPESTATUS[0]}"
echo "== bench"
timeout 240 "$B"/bench/tandem_cuda_matmul_bench
