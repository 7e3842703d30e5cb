#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/dequantize.h"

namespace tandem::cpu {

namespace {

constexpr int64_t kRowTile = 16;  // weight rows that meet each token together (stay in L1/L2)

// The 8-bit-activation product: quantize each token row once, then integer dots.
void matmul_q8(const WeightMatrix& w, const float* X, int64_t n_tokens, float* Y, const CpuKernels& k) {
  const int64_t nb = w.cols / 32;
  std::vector<BlockQ8Act> xq((size_t)(n_tokens * nb));  // [n_tokens, cols / 32]
  const int64_t n_tiles = (w.rows + kRowTile - 1) / kRowTile;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tokens; t++) k.quantize_act(X + t * w.cols, xq.data() + t * nb, w.cols);
#pragma omp for schedule(static)
    for (int64_t ti = 0; ti < n_tiles; ti++) {
      const int64_t r0 = ti * kRowTile;
      const int64_t nr = std::min(kRowTile, w.rows - r0);
      for (int64_t t = 0; t < n_tokens; t++) {
        float* yt = Y + t * w.rows + r0;
        const BlockQ8Act* xt = xq.data() + t * nb;
        for (int64_t r = 0; r < nr; r++) yt[r] = w.qdot(w.row(r0 + r), xt, w.cols);
      }
    }
  }
}

}  // namespace

void matvec(const WeightMatrix& w, const float* x, float* y, const CpuKernels& k) {
  if (w.qdot) {
    matmul_q8(w, x, 1, y, k);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < w.rows; r++) y[r] = w.dot(w.row(r), x, w.cols);
}

void matmul(const WeightMatrix& w, const float* X, int64_t n_tokens, float* Y, const CpuKernels& k) {
  if (w.qdot) {
    matmul_q8(w, X, n_tokens, Y, k);
    return;
  }
  // With few tokens, decoding each row to float costs more than it saves.
  if (n_tokens < 4) {
    for (int64_t t = 0; t < n_tokens; t++) matvec(w, X + t * w.cols, Y + t * w.rows, k);
    return;
  }
  const int64_t n_tiles = (w.rows + kRowTile - 1) / kRowTile;
#pragma omp parallel
  {
    std::vector<float> tile((size_t)kRowTile * w.cols);  // [kRowTile, cols] decoded weights
#pragma omp for schedule(static)
    for (int64_t ti = 0; ti < n_tiles; ti++) {
      const int64_t r0 = ti * kRowTile;
      const int64_t nr = std::min(kRowTile, w.rows - r0);
      for (int64_t r = 0; r < nr; r++) dequantize_row(w.type, w.row(r0 + r), tile.data() + r * w.cols, w.cols);
      for (int64_t t = 0; t < n_tokens; t++) {
        const float* xt = X + t * w.cols;
        float* yt = Y + t * w.rows + r0;
        for (int64_t r = 0; r < nr; r++) yt[r] = k.dot_f32(tile.data() + r * w.cols, xt, w.cols);
      }
    }
  }
}

}  // namespace tandem::cpu
