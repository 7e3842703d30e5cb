#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"

namespace tandem::cpu {

namespace {

// Runs body on every thread of a team: the caller's team when every thread of an enclosing
// region called in (decode runs a whole pass in one region), else a new region. The body's
// `omp for` loops bind to that team and end in its barrier.
template <typename Body>
void in_team(Body body) {
  if (omp_in_parallel()) {
    body();
    return;
  }
#pragma omp parallel
  body();
}

// The one attention body. Query row i (at position pos_of(i)) attends over keys [0, pos_of(i)];
// rows(i, t, kv_head) returns the K and V row pointers of key t as that query sees them. Both
// entry points below differ only in that mapping, so they compute the same floats in the same
// order.
template <typename PosOf, typename Rows>
void attend(const float* q, int64_t n_q, int64_t max_keys, PosOf pos_of, Rows rows, DType kv_type,
            const AttentionShape& s, float* out, const CpuKernels& kernels) {
  const int64_t q_stride = (int64_t)s.n_head * s.head_dim;
  const int group = s.n_head / s.n_kv_head;
  const float scale = 1.0f / std::sqrt((float)s.head_dim);
  const RowDotFn dot = kernels.row_dot(kv_type);
  const AxpyFn axpy = kernels.axpy(kv_type);
  const AttendHeadsFn heads = kernels.isa == Isa::Avx512 ? attend_heads_kernel_avx512(kv_type, s.head_dim)
                              : kernels.isa == Isa::Avx2 ? attend_heads_kernel_avx2(kv_type, s.head_dim)
                                                         : nullptr;
  if (heads) {
    // Work items: a query row's heads that share a KV head, so each K and V row is widened
    // once for all of them; with few rows (decode), single heads, so threads get even shares.
    const int per_item = n_q * s.n_kv_head >= 16 ? group : 1;
    const int64_t items_per_row = s.n_head / per_item;
    in_team([&] {
      std::vector<const uint8_t*> k_rows((size_t)max_keys), v_rows((size_t)max_keys);
      std::vector<float> scores((size_t)(per_item * max_keys));
#pragma omp for schedule(dynamic, 2)
      for (int64_t w = 0; w < n_q * items_per_row; w++) {
        const int64_t i = w / items_per_row;
        const int h0 = (int)(w % items_per_row) * per_item;
        const int64_t n_keys = pos_of(i) + 1;
        for (int64_t t = 0; t < n_keys; t++) std::tie(k_rows[(size_t)t], v_rows[(size_t)t]) = rows(i, t, h0 / group);
        const int64_t at = i * q_stride + (int64_t)h0 * s.head_dim;
        heads(s.head_dim, per_item, q + at, k_rows.data(), v_rows.data(), n_keys, scale, scores.data(), max_keys, out + at);
      }
    });
    return;
  }
  const int64_t n_work = n_q * s.n_head;
  in_team([&] {
    std::vector<float> scores((size_t)max_keys);  // [n_keys] of one query row
#pragma omp for schedule(dynamic, 4)
    for (int64_t w = 0; w < n_work; w++) {
      const int64_t i = w / s.n_head;
      const int h = (int)(w % s.n_head);
      const int kvh = h / group;
      const int64_t n_keys = pos_of(i) + 1;
      const float* qh = q + i * q_stride + (int64_t)h * s.head_dim;
      for (int64_t t = 0; t < n_keys; t++) scores[t] = dot(rows(i, t, kvh).first, qh, s.head_dim) * scale;
      softmax(scores.data(), n_keys);
      float* oh = out + i * q_stride + (int64_t)h * s.head_dim;
      std::memset(oh, 0, sizeof(float) * s.head_dim);
      for (int64_t t = 0; t < n_keys; t++) axpy(scores[t], rows(i, t, kvh).second, oh, s.head_dim);
    }
  });
}

using RowPair = std::pair<const uint8_t*, const uint8_t*>;  // K row, V row

}  // namespace

void attention(const float* q, const void* k, const void* v, DType kv_type, int64_t n_q, int64_t pos0,
               const AttentionShape& s, float* out, const CpuKernels& kernels) {
  const size_t elem = kv_type == DType::F16 ? 2 : 4;
  const size_t row_bytes = (size_t)s.n_kv_head * s.head_dim * elem, head_bytes = (size_t)s.head_dim * elem;
  const auto* kb = static_cast<const uint8_t*>(k);
  const auto* vb = static_cast<const uint8_t*>(v);
  attend(
      q, n_q, pos0 + n_q, [pos0](int64_t i) { return pos0 + i; },
      [=](int64_t, int64_t t, int kvh) {
        const size_t at = (size_t)t * row_bytes + (size_t)kvh * head_bytes;
        return RowPair(kb + at, vb + at);
      },
      kv_type, s, out, kernels);
}

void attention_paged(const float* q, int64_t n_q, const int64_t* pos, const int* seq, const PagedKvView* views,
                     DType kv_type, const AttentionShape& s, float* out, const CpuKernels& kernels) {
  const size_t head_bytes = (size_t)s.head_dim * (kv_type == DType::F16 ? 2 : 4);
  int64_t max_keys = 0;
  for (int64_t i = 0; i < n_q; i++) max_keys = std::max(max_keys, pos[i] + 1);
  attend(
      q, n_q, max_keys, [pos](int64_t i) { return pos[i]; },
      [=](int64_t i, int64_t t, int kvh) {
        const PagedKvView& kv = views[seq[i]];
        const uint8_t* block = kv.pool + (size_t)kv.table[t / kv.block_tokens] * kv.block_bytes +
                               (size_t)(t % kv.block_tokens) * kv.row_bytes + (size_t)kvh * head_bytes;
        return RowPair(block + kv.k_offset, block + kv.v_offset);
      },
      kv_type, s, out, kernels);
}

}  // namespace tandem::cpu
