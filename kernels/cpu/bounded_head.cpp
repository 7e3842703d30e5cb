#include "kernels/cpu/bounded_head.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/fp16.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/work_team.h"

namespace tandem::cpu {

std::shared_ptr<const BoundedHead> BoundedHead::make(const WeightMatrix& exact, const CpuKernels& q8) {
  if (exact.type != DType::Q8_0 || !exact.dot || !exact.dot_tokens || exact.is_packed() || exact.cols % kQK != 0 ||
      !q8.quantized_activations || !q8.packed(DType::Q8_0))
    return nullptr;
  auto head = std::make_shared<BoundedHead>();
  WeightMatrix& w = head->int8;
  w.type = exact.type, w.data = exact.data, w.rows = exact.rows, w.cols = exact.cols, w.row_bytes = exact.row_bytes;
  w.dot = q8.row_dot(w.type);
  w.qdot = q8.quant_dot(w.type);
  w.qdot4 = q8.quant_dot4(w.type);
  w.pack_for(q8);
  if (!w.packed_gemm) return nullptr;
  // Per row, the largest block's |d| x sum |q| (a block's own value is exact in float: 11 bits
  // of d times at most 32 x 127). One number a row keeps the bound a multiply (see below).
  const int64_t nb = exact.cols / kQK;
  head->block_abs.resize((size_t)exact.rows);
  parallel_for(exact.rows, Split{256, 0}, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; r++) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(exact.row(r));
      float most = 0;
      for (int64_t b = 0; b < nb; b++) {
        int s = 0;
        for (int i = 0; i < kQK; i++) s += std::abs((int)blk[b].qs[i]);
        most = std::max(most, std::fabs(fp16_to_fp32(blk[b].d)) * (float)s);
      }
      head->block_abs[(size_t)r] = most;
    }
  });
  return head;
}

namespace {

// Token t's bound factor: sum over blocks of h_b (1 + 1e-6) + 1e-5 m_b, times 1 + 1e-4 (see
// the header); infinity when an activation is not finite.
float bound_factor(const float* x, int64_t cols, const CpuKernels& q8) {
  for (int64_t i = 0; i < cols; i++)
    if (!std::isfinite(x[i])) return std::numeric_limits<float>::infinity();
  thread_local std::vector<BlockQ8Act> xq;
  const int64_t nb = cols / kQK;
  xq.resize((size_t)nb);
  q8.quantize_act(x, xq.data(), cols);
  double sum = 0;
  for (int64_t b = 0; b < nb; b++) {
    float h = 0, m = 0;
    for (int i = 0; i < kQK; i++) {
      const float v = x[b * kQK + i];
      h = std::max(h, std::fabs(v - xq[(size_t)b].d * (float)xq[(size_t)b].qs[i]));
      m = std::max(m, std::fabs(v));
    }
    sum += (double)h * (1 + 1e-6) + 1e-5 * (double)m;
  }
  return (float)(sum * (1 + 1e-4));
}

}  // namespace

void bounded_head_logits(const WeightMatrix& exact, const BoundedHead& head, const float* X, int64_t n_tokens,
                         float* out, const CpuKernels& q8) {
  const int64_t rows = exact.rows, cols = exact.cols;
  thread_local std::vector<float> factors;
  factors.resize((size_t)n_tokens);
  for (int64_t t = 0; t < n_tokens; t++) factors[(size_t)t] = bound_factor(X + t * cols, cols, q8);
  // Activations that are not all finite have no bound (and no defined 8-bit form): the exact
  // head, whose floats carry them as they are.
  if (!std::all_of(factors.begin(), factors.end(), [](float g) { return std::isfinite(g); })) {
    matmul(exact, X, n_tokens, out, q8);
    return;
  }
  matmul(head.int8, X, n_tokens, out, q8);  // every logit on 8-bit activations
  const float* M = head.block_abs.data();
  const float* F = factors.data();  // the caller's (a thread_local named in the items would be each thread's own)
  parallel_for(n_tokens, Split{1, 0}, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; t++) {
      const float* x = X + t * cols;
      float* z = out + t * rows;
      // Row r's exact float lies within z[r] +- M[r] G (M[r] G bounds the sum over its blocks).
      const float G = F[t];
      // The best lower end, and the largest 8-bit logit (its row is likely the argmax). Eight
      // lanes of partial maxima so the compiler vectorises the scan (49152 rows a token).
      constexpr int kLanes = 8;
      float lo8[kLanes], hi8[kLanes];
      std::fill(lo8, lo8 + kLanes, -std::numeric_limits<float>::infinity());
      std::fill(hi8, hi8 + kLanes, -std::numeric_limits<float>::infinity());
      int64_t r = 0;
      for (; r + kLanes <= rows; r += kLanes)
        for (int k = 0; k < kLanes; k++) {
          lo8[k] = std::max(lo8[k], z[r + k] - M[r + k] * G);
          hi8[k] = std::max(hi8[k], z[r + k]);
        }
      for (; r < rows; r++) lo8[0] = std::max(lo8[0], z[r] - M[r] * G), hi8[0] = std::max(hi8[0], z[r]);
      const float lo = *std::max_element(lo8, lo8 + kLanes), hi = *std::max_element(hi8, hi8 + kLanes);
      const int64_t top = std::find(z, z + rows, hi) - z;
      // No row whose interval ends below thr can be the argmax: the top row's exact float, or
      // the best lower end, is reached by a row that is recomputed.
      const float top_exact = exact.dot(exact.row(top), x, cols);
      const float thr = std::max(lo, top_exact);
      auto settle = [&](int64_t i) {
        const float reach = M[i] * G;
        if (i == top)
          z[i] = top_exact;
        else if (z[i] + reach >= thr)
          z[i] = exact.dot(exact.row(i), x, cols);
        else
          z[i] = z[i] - reach;  // below thr, so below every row that can be the argmax
      };
      for (r = 0; r + kLanes <= rows; r += kLanes) {
        bool any = false;
        for (int k = 0; k < kLanes; k++) any |= z[r + k] + M[r + k] * G >= thr;
        if (any || (top >= r && top < r + kLanes)) {
          for (int k = 0; k < kLanes; k++) settle(r + k);
        } else {
          for (int k = 0; k < kLanes; k++) z[r + k] -= M[r + k] * G;
        }
      }
      for (; r < rows; r++) settle(r);
    }
  });
}

}  // namespace tandem::cpu
