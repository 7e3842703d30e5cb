#!/usr/bin/env bash
# Run HERE (the dev machine) before a GPU session: fills .device/ (git-ignored), which the device
# run carries (run(command="scripts/gpu_check.sh", carry=[".device"])), so the 15-minute window
# builds nothing:
#   .device/bin/  tandem, tandem_cuda_tests, tandem_tests (its CudaMatmul* tests),
#                 tandem_backend_tests, tandem_cuda_matmul_bench: this build's, for sm_90
#   .device/lib/  the shared libraries they need that the GPU image lacks (libcudart.so.13,
#                 libfmt, libpcre2-8, libgomp); libcublas.so.13 stays behind (54 MB + its
#                 542 MB cuBLASLt): gpu_check.sh finds the image's own and checks it opens
#   .device/python/gguf/  the `gguf` package (pure Python, 1.4 MB), which the image lacks, for
#                 scripts/gpu/torch_reference.py (the PyTorch reference the CUDA pass is checked by)
#   .device/manifest.txt  commit, files and sizes
# Everything carried must stay under the device tool's 64 MiB (checked here; ~27 MiB today).
#   scripts/gpu_prepare.sh [--no-build]     (BUILD=build, DEST=.device)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DEST=${DEST:-.device}
LIMIT_MIB=${LIMIT_MIB:-60}  # of the tool's 64 MiB: the tracked tree (~3 MB) travels too
BINS="tandem tests/tandem_cuda_tests tests/tandem_tests tests/tandem_backend_tests bench/tandem_cuda_matmul_bench"
# Libraries the image has (glibc's and the compiler's runtime, newer there): not carried.
SYSTEM_LIBS='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|ld-linux|libstdc\+\+\.so|libgcc_s\.so)'
# Too large to carry (libnccl.so.2 is 218 MB): gpu_check.sh finds the image's copy (PyTorch's
# nvidia-nccl package) as it finds cuBLAS; only tandem_cuda_tests' NCCL test needs it.
IMAGE_LIBS='^(libnccl\.so)'

grep -q '^TANDEM_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null ||
  { echo "gpu_prepare: $BUILD is not a CUDA build (cmake -S . -B $BUILD -DTANDEM_CUDA=ON)" >&2; exit 1; }
# The kernels must be compiled for Hopper (CMakeLists.txt's default CMAKE_CUDA_ARCHITECTURES=90).
arch=$(cat "$BUILD"/CMakeFiles/tandem_cuda*.dir/flags.make 2>/dev/null | grep -oE 'arch=compute_[0-9a-z]+' | sort -u | tr '\n' ' ')
if [ "$arch" != "arch=compute_90 " ]; then
  echo "gpu_prepare: $BUILD's CUDA code is for '${arch:-nothing found}', not only sm_90 (-DCMAKE_CUDA_ARCHITECTURES=90)" >&2
  exit 1
fi
if [ "${1:-}" != "--no-build" ]; then
  targets=""
  for b in $BINS; do targets+=" --target $(basename "$b")"; done
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j"${JOBS:-2}" $targets
fi

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib"
for b in $BINS; do
  [ -x "$BUILD/$b" ] || { echo "gpu_prepare: $BUILD/$b is not built" >&2; exit 1; }
  cp "$BUILD/$b" "$DEST/bin/"
done
# Each binary's libraries, resolved here, minus the image's own.
for b in "$DEST"/bin/*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  echo "$name" | grep -Eq "$SYSTEM_LIBS" && continue
  echo "$name" | grep -Eq "$IMAGE_LIBS" && continue
  cp -L "$path" "$DEST/lib/$name"
done
gguf_dir=$(python3 -c 'import gguf, os; print(os.path.dirname(gguf.__file__))' 2>/dev/null || true)
if [ -n "$gguf_dir" ]; then
  mkdir -p "$DEST/python"
  cp -r "$gguf_dir" "$DEST/python/gguf"
  find "$DEST/python" -name __pycache__ -prune -exec rm -rf {} +
else
  echo "gpu_prepare: warning: no gguf package here (pip install gguf): the torch reference stage will skip" >&2
fi
[ -f "$DEST/lib/libcudart.so.13" ] || echo "gpu_prepare: warning: no libcudart.so.13 carried (linked statically?)" >&2

{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!models' 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%FT%TZ) on $(uname -n), $(ldd --version | head -n 1)"
  echo "cuda $arch"
  (cd "$DEST" && find bin lib -type f -printf '%s %p\n' | sort -k2)
  if [ -d "$DEST/python/gguf" ]; then echo "python/gguf $(du -sb "$DEST/python" | cut -f1) bytes"; fi
} >"$DEST/manifest.txt"
total=$(du -sb "$DEST" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
echo "gpu_prepare: $DEST holds $((total / 1048576)) MiB; with the tracked tree $(((total + tree) / 1048576)) MiB of the 64 MiB that travel"
if [ $((total + tree)) -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "gpu_prepare: over ${LIMIT_MIB} MiB: carry fewer binaries (tandem_tests is the largest)" >&2
  exit 1
fi
