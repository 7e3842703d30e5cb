#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"

namespace tandem::cpu {

void attention(const float* q, const void* k, const void* v, DType kv_type, int64_t n_q, int64_t pos0,
               const AttentionShape& s, float* out, const CpuKernels& kernels) {
  const int64_t q_stride = (int64_t)s.n_head * s.head_dim;
  const int64_t kv_stride = (int64_t)s.n_kv_head * s.head_dim;
  const size_t elem = kv_type == DType::F16 ? 2 : 4;
  const int group = s.n_head / s.n_kv_head;
  const float scale = 1.0f / std::sqrt((float)s.head_dim);
  const RowDotFn dot = kernels.row_dot(kv_type);
  const AxpyFn axpy = kernels.axpy(kv_type);
  const auto* kb = static_cast<const uint8_t*>(k);
  const auto* vb = static_cast<const uint8_t*>(v);
  const int64_t n_work = n_q * s.n_head;
#pragma omp parallel
  {
    std::vector<float> scores((size_t)(pos0 + n_q));  // [n_keys] of one query row
#pragma omp for schedule(dynamic, 4)
    for (int64_t w = 0; w < n_work; w++) {
      const int64_t i = w / s.n_head;
      const int h = (int)(w % s.n_head);
      const int kvh = h / group;
      const int64_t n_keys = pos0 + i + 1;
      const float* qh = q + i * q_stride + (int64_t)h * s.head_dim;
      for (int64_t t = 0; t < n_keys; t++)
        scores[t] = dot(kb + ((size_t)t * kv_stride + (size_t)kvh * s.head_dim) * elem, qh, s.head_dim) * scale;
      softmax(scores.data(), n_keys);
      float* oh = out + i * q_stride + (int64_t)h * s.head_dim;
      std::memset(oh, 0, sizeof(float) * s.head_dim);
      for (int64_t t = 0; t < n_keys; t++)
        axpy(scores[t], vb + ((size_t)t * kv_stride + (size_t)kvh * s.head_dim) * elem, oh, s.head_dim);
    }
  }
}

void attention_paged(const float* q, int64_t n_q, const int64_t* pos, const int* seq, const PagedKvView* views,
                     DType kv_type, const AttentionShape& s, float* out, const CpuKernels& kernels) {
  const int64_t q_stride = (int64_t)s.n_head * s.head_dim;
  const size_t elem = kv_type == DType::F16 ? 2 : 4;
  const int group = s.n_head / s.n_kv_head;
  const float scale = 1.0f / std::sqrt((float)s.head_dim);
  const RowDotFn dot = kernels.row_dot(kv_type);
  const AxpyFn axpy = kernels.axpy(kv_type);
  int64_t max_keys = 0;
  for (int64_t i = 0; i < n_q; i++) max_keys = std::max(max_keys, pos[i] + 1);
  const int64_t n_work = n_q * s.n_head;
#pragma omp parallel
  {
    std::vector<float> scores((size_t)max_keys);  // [n_keys] of one query row
#pragma omp for schedule(dynamic, 4)
    for (int64_t w = 0; w < n_work; w++) {
      const int64_t i = w / s.n_head;
      const int h = (int)(w % s.n_head);
      const size_t head_off = (size_t)(h / group) * s.head_dim * elem;
      const PagedKvView& kv = views[seq[i]];
      auto row = [&](int64_t t, size_t layer_off) {
        return kv.pool + (size_t)kv.table[t / kv.block_tokens] * kv.block_bytes + layer_off +
               (size_t)(t % kv.block_tokens) * kv.row_bytes + head_off;
      };
      const int64_t n_keys = pos[i] + 1;
      const float* qh = q + i * q_stride + (int64_t)h * s.head_dim;
      for (int64_t t = 0; t < n_keys; t++) scores[t] = dot(row(t, kv.k_offset), qh, s.head_dim) * scale;
      softmax(scores.data(), n_keys);
      float* oh = out + i * q_stride + (int64_t)h * s.head_dim;
      std::memset(oh, 0, sizeof(float) * s.head_dim);
      for (int64_t t = 0; t < n_keys; t++) axpy(scores[t], row(t, kv.v_offset), oh, s.head_dim);
    }
  }
}

}  // namespace tandem::cpu
