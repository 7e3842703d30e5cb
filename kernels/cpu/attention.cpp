#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/work_team.h"

namespace tandem::cpu {

namespace {

// A buffer the team's threads all read and write: the calling thread's, kept between calls.
float* team_buffer(size_t n) {
  thread_local std::vector<float> store;
  if (store.size() < n) store.resize(n);
  return store.data();
}

// A thread's own scratch of at least n floats, kept between calls (slot 0 and 1: two kinds).
float* own_scratch(int which, size_t n) {
  thread_local std::vector<float> store[4];
  std::vector<float>& v = store[which];
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Key segment sg of a row with n_keys keys: [first, first + count).
struct Segment {
  int64_t first, count;
};
Segment segment(int64_t n_keys, int64_t sg) {
  const int64_t first = sg * kAttentionSegmentKeys;
  return {first, std::min(kAttentionSegmentKeys, n_keys - first)};
}
int64_t segments(int64_t n_keys) { return (n_keys + kAttentionSegmentKeys - 1) / kAttentionSegmentKeys; }

// One head's output from its segments' outputs o[sg * o_stride] (each softmax-normalized
// within its segment) and statistics st[sg * st_stride] = (max, sum of exps): each segment
// weighs sum * exp(max - overall max), in segment order. A sink (-inf: none) is one more
// segment of sum 1 at max `sink` whose output is zero.
void merge_segments(int64_t n_seg, const float* o, int64_t o_stride, const float* st, int64_t st_stride, int head_dim,
                    float* out, float sink = -INFINITY) {
  float m = sink;
  for (int64_t sg = 0; sg < n_seg; sg++) m = std::max(m, st[sg * st_stride]);
  float total = sink == -INFINITY ? 0.0f : std::exp(sink - m);
  for (int64_t sg = 0; sg < n_seg; sg++) total += st[sg * st_stride + 1] * std::exp(st[sg * st_stride] - m);
  for (int d = 0; d < head_dim; d++) out[d] = 0;
  for (int64_t sg = 0; sg < n_seg; sg++) {
    const float w = st[sg * st_stride + 1] * std::exp(st[sg * st_stride] - m) / total;
    for (int d = 0; d < head_dim; d++) out[d] += w * o[sg * o_stride + d];
  }
}

// A thread's scratch for the head kernels: K and V row pointers of a segment, the scores of its
// heads, and the segments of a row it does alone (own_o: [n_seg][per_item] outputs, own_st
// their (max, sum) pairs).
struct Scratch {
  const uint8_t** k_rows;
  const uint8_t** v_rows;
  float *scores, *own_o, *own_st;
};
Scratch thread_scratch(int per_item, int64_t seg_keys, size_t own, int hd) {
  thread_local std::vector<const uint8_t*> kv;
  if (kv.size() < (size_t)(2 * seg_keys)) kv.resize((size_t)(2 * seg_keys));
  float* f = own_scratch(0, (size_t)(per_item * seg_keys) + own * hd + own * 2);
  return Scratch{kv.data(), kv.data() + seg_keys, f, f + per_item * seg_keys, f + per_item * seg_keys + own * hd};
}

// softmax over x[0, n) and one more logit `sink` that has no entry of its own.
void softmax_with_sink(float* x, int64_t n, float sink) {
  const float mx = std::max(sink, *std::max_element(x, x + n));
  float sum = std::exp(sink - mx);
  for (int64_t i = 0; i < n; i++) sum += (x[i] = std::exp(x[i] - mx));
  for (int64_t i = 0; i < n; i++) x[i] /= sum;
}

// Attention without a head kernel: each (row, head) on its own, through the row dot and axpy.
template <typename KeysOf, typename LoOf, typename Rows>
void attend_by_head(const float* q, int64_t n_q, KeysOf keys_of, LoOf lo_of, Rows rows, DType kv_type,
                    const AttentionShape& s, float scale, int64_t max_keys, float* out, const CpuKernels& kernels) {
  const int64_t q_stride = (int64_t)s.n_head * s.head_dim;
  const int group = s.n_head / s.n_kv_head;
  const RowDotFn dot = kernels.row_dot(kv_type);
  const AxpyFn axpy = kernels.axpy(kv_type);
  parallel_for(n_q * s.n_head, Split{4, 0}, [&](int64_t b, int64_t e, int) {
    float* scores = own_scratch(1, (size_t)max_keys);  // [n_keys] of one query row
    for (int64_t w = b; w < e; w++) {
      const int64_t i = w / s.n_head;
      const int h = (int)(w % s.n_head);
      const int kvh = h / group;
      const int64_t n_keys = keys_of(i), lo = lo_of(i);
      const float* qh = q + i * q_stride + (int64_t)h * s.head_dim;
      for (int64_t t = 0; t < n_keys; t++) scores[t] = dot(rows(i, lo + t, kvh).first, qh, s.head_dim) * scale;
      if (s.sinks)
        softmax_with_sink(scores, n_keys, s.sinks[h]);
      else
        softmax(scores, n_keys);
      float* oh = out + i * q_stride + (int64_t)h * s.head_dim;
      std::memset(oh, 0, sizeof(float) * s.head_dim);
      for (int64_t t = 0; t < n_keys; t++) axpy(scores[t], rows(i, lo + t, kvh).second, oh, s.head_dim);
    }
  });
}

// Merges the segment results of every row that has more than one segment into out.
template <typename KeysOf>
void merge_split_rows(int64_t n_q, int64_t max_seg, KeysOf keys_of, const AttentionShape& s, const float* part_o,
                      const float* part_st, float* out) {
  const int64_t q_stride = (int64_t)s.n_head * s.head_dim;
  const int hd = s.head_dim;
  parallel_for(n_q * s.n_head, Split{1, 1}, [&](int64_t b, int64_t e, int) {
    for (int64_t w = b; w < e; w++) {
      const int64_t i = w / s.n_head;
      const int h = (int)(w % s.n_head);
      const int64_t n_seg = segments(keys_of(i));
      if (n_seg == 1 && !s.sinks) continue;
      const int64_t at = i * max_seg * s.n_head + h;
      merge_segments(n_seg, part_o + at * hd, s.n_head * hd, part_st + at * 2, s.n_head * 2, hd,
                     out + i * q_stride + (int64_t)h * hd, s.sinks ? s.sinks[h] : -INFINITY);
    }
  });
}

// The one attention body. Query row i (at position pos_of(i)) attends over keys
// [first_key(pos_of(i)), pos_of(i)]; rows(i, t, kv_head) returns the K and V row pointers of
// key t as that query sees them. Both entry points below differ only in that mapping, so they
// compute the same floats in the same order.
template <typename PosOf, typename Rows>
void attend(const float* q, int64_t n_q, PosOf pos_of, Rows rows, DType kv_type, const AttentionShape& s, float* out,
            const CpuKernels& kernels) {
  const int64_t q_stride = (int64_t)s.n_head * s.head_dim;
  const int group = s.n_head / s.n_kv_head;
  const float scale = s.scale != 0.0f ? s.scale : 1.0f / std::sqrt((float)s.head_dim);
  auto lo_of = [&](int64_t i) { return first_key(s, pos_of(i)); };
  auto keys_of = [&](int64_t i) { return pos_of(i) - lo_of(i) + 1; };
  int64_t max_keys = 0;
  for (int64_t i = 0; i < n_q; i++) max_keys = std::max(max_keys, keys_of(i));
  const AttendHeadsFn heads = kernels.attend_heads(kv_type, s.head_dim);
  if (heads) {
    // Work items: a query row's heads that share a KV head, so each K and V row is widened
    // once for all of them. With few rows (decode) there are too few such items for even
    // shares: short rows go as single heads, long ones as (heads, key segment) items whose
    // results a second loop merges.
    const int64_t max_seg = segments(max_keys);
    const bool few_rows = n_q * s.n_kv_head < 16;
    const bool split = few_rows && max_seg > 1;
    const int per_item = few_rows && !split ? 1 : group;
    const int64_t items_per_row = s.n_head / per_item;
    const int64_t seg_keys = std::min(max_keys, kAttentionSegmentKeys);
    const int hd = s.head_dim;
    // Segment results of split rows: [n_q][max_seg][n_head] outputs and (max, sum) pairs.
    float* part_o = split ? team_buffer((size_t)(n_q * max_seg * s.n_head * (hd + 2))) : nullptr;
    float* part_st = split ? part_o + n_q * max_seg * s.n_head * hd : nullptr;
    const size_t own = split ? 0 : (size_t)(max_seg * per_item);  // with sinks, single-segment rows too
    auto scratch = [&] { return thread_scratch(per_item, seg_keys, own, hd); };
    // Heads [h0, h0 + per_item) of row i over segment sg into o / st (stats: nullptr when the
    // row has one segment and o is its output).
    auto run = [&](const Scratch& sc, int64_t i, int h0, int64_t sg, float* o, float* st) {
      const Segment g = segment(keys_of(i), sg);
      const int64_t lo = lo_of(i);
      for (int64_t t = 0; t < g.count; t++)
        std::tie(sc.k_rows[(size_t)t], sc.v_rows[(size_t)t]) = rows(i, lo + g.first + t, h0 / group);
      heads(hd, per_item, q + i * q_stride + (int64_t)h0 * hd, sc.k_rows, sc.v_rows, g.count, scale, sc.scores,
            seg_keys, o, st);
    };
    if (split) {
      parallel_for(n_q * items_per_row * max_seg, Split{1, 0}, [&](int64_t b, int64_t e, int) {
        const Scratch sc = scratch();
        for (int64_t w = b; w < e; w++) {
          const int64_t i = w / (items_per_row * max_seg), sg = w % max_seg;
          const int h0 = (int)(w / max_seg % items_per_row) * per_item;
          const int64_t n_seg = segments(keys_of(i));
          if (sg >= n_seg) continue;
          if (n_seg == 1 && !s.sinks) {  // with sinks every row is merged (the sink joins there)
            run(sc, i, h0, 0, out + i * q_stride + (int64_t)h0 * hd, nullptr);
          } else {
            const int64_t at = (i * max_seg + sg) * s.n_head + h0;
            run(sc, i, h0, sg, part_o + at * hd, part_st + at * 2);
          }
        }
      });
      merge_split_rows(n_q, max_seg, keys_of, s, part_o, part_st, out);
      return;
    }
    parallel_for(n_q * items_per_row, Split{2, 0}, [&](int64_t b, int64_t e, int) {
      const Scratch sc = scratch();
      for (int64_t w = b; w < e; w++) {
        const int64_t i = w / items_per_row;
        const int h0 = (int)(w % items_per_row) * per_item;
        const int64_t n_seg = segments(keys_of(i));
        float* o = out + i * q_stride + (int64_t)h0 * hd;
        if (n_seg == 1 && !s.sinks) {
          run(sc, i, h0, 0, o, nullptr);
          continue;
        }
        for (int64_t sg = 0; sg < n_seg; sg++) run(sc, i, h0, sg, sc.own_o + sg * per_item * hd, sc.own_st + sg * per_item * 2);
        for (int h = 0; h < per_item; h++)
          merge_segments(n_seg, sc.own_o + h * hd, per_item * hd, sc.own_st + h * 2, per_item * 2, hd, o + h * hd,
                         s.sinks ? s.sinks[h0 + h] : -INFINITY);
      }
    });
    return;
  }
  attend_by_head(q, n_q, keys_of, lo_of, rows, kv_type, s, scale, max_keys, out, kernels);
}

using RowPair = std::pair<const uint8_t*, const uint8_t*>;  // K row, V row

// Bytes of one head's head_dim elements in the cache: 4 or 2 per element (F32, F16), or
// head_dim / 32 blocks of 34 (Q8_0), so head h of a row starts at h * head_bytes.
size_t head_bytes(DType kv_type, int head_dim) { return row_bytes(*dtype_info((uint32_t)kv_type), (uint64_t)head_dim); }

}  // namespace

void attention(const float* q, const void* k, const void* v, DType kv_type, int64_t n_q, int64_t pos0,
               const AttentionShape& s, float* out, const CpuKernels& kernels) {
  const size_t head = head_bytes(kv_type, s.head_dim), row = (size_t)s.n_kv_head * head;
  const auto* kb = static_cast<const uint8_t*>(k);
  const auto* vb = static_cast<const uint8_t*>(v);
  attend(
      q, n_q, [pos0](int64_t i) { return pos0 + i; },
      [=](int64_t, int64_t t, int kvh) {
        const size_t at = (size_t)t * row + (size_t)kvh * head;
        return RowPair(kb + at, vb + at);
      },
      kv_type, s, out, kernels);
}

void attention_paged(const float* q, int64_t n_q, const int64_t* pos, const int* seq, const PagedKvView* views,
                     DType kv_type, const AttentionShape& s, float* out, const CpuKernels& kernels) {
  const size_t head = head_bytes(kv_type, s.head_dim);
  // Every key's rows are looked up through its block (once per key, KV head and layer: 184k
  // lookups a decode token at 2048 keys for SmolLM2); with power-of-two blocks (16 by default)
  // that is a shift and a mask, not two integer divisions of ~25 cycles each.
  const int bt = n_q > 0 ? views[seq[0]].block_tokens : 1;
  bool pow2 = bt > 0 && (bt & (bt - 1)) == 0;
  for (int64_t i = 0; i < n_q; i++) pow2 &= views[seq[i]].block_tokens == bt;
  const int shift = pow2 ? __builtin_ctz((unsigned)bt) : 0;
  const int64_t mask = pow2 ? bt - 1 : 0;
  auto rows = [=](int64_t i, int64_t t, int kvh) {
    const PagedKvView& kv = views[seq[i]];
    const int64_t blk = pow2 ? t >> shift : t / kv.block_tokens, row = pow2 ? t & mask : t % kv.block_tokens;
    const uint8_t* block = kv.pool + (size_t)kv.table[blk] * kv.block_bytes + (size_t)row * kv.row_bytes + (size_t)kvh * head;
    return RowPair(block + kv.k_offset, block + kv.v_offset);
  };
  attend(q, n_q, [pos](int64_t i) { return pos[i]; }, rows, kv_type, s, out, kernels);
}

}  // namespace tandem::cpu
