#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/dequantize.h"

namespace tandem::cpu {

void matvec(const WeightMatrix& w, const float* x, float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < w.rows; r++) y[r] = w.dot(w.row(r), x, w.cols);
}

void matmul(const WeightMatrix& w, const float* X, int64_t n_tokens, float* Y, const CpuKernels& k) {
  // With few tokens, decoding each row to float costs more than it saves.
  if (n_tokens < 4) {
    for (int64_t t = 0; t < n_tokens; t++) matvec(w, X + t * w.cols, Y + t * w.rows);
    return;
  }
  constexpr int64_t kRowTile = 16;  // rows decoded together: 16 x cols floats stay in L2
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
