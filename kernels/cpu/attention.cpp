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

// Segments sit at absolute positions [256 k, 256 (k + 1)): a row whose keys are [lo, lo + n)
// has the part of each such range it holds. Rows whose windows start at different keys then
// still hold the same whole segments, which a block of them reads once; and where the
// segments fall depends only on the row's keys, so a row gives the same floats alone, in a
// prefill batch, or decoded. Segment sg of the row, relative to lo: [first, first + count).
struct Segment {
  int64_t first, count;
};
constexpr int64_t kSeg = kAttentionSegmentKeys;
Segment segment(int64_t lo, int64_t n_keys, int64_t sg) {
  const int64_t start = sg == 0 ? lo : (lo / kSeg + sg) * kSeg, end = std::min(lo + n_keys, (lo / kSeg + sg + 1) * kSeg);
  return {start - lo, end - start};
}
int64_t segments(int64_t lo, int64_t n_keys) { return (lo + n_keys - 1) / kSeg - lo / kSeg + 1; }

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

// Where the blocked path's blocks start (the calling thread's, kept between calls).
std::vector<int64_t>& block_starts_store() {
  thread_local std::vector<int64_t> starts;
  return starts;
}

// What every path of one attention call sees: query row i (at position pos_of(i)) attends over
// keys [lo(i), pos_of(i)]; rows(i, t, kv_head) returns the K and V row pointers of key t as
// that query sees them, and same_keys(i, j) says whether rows i and j read the same cache (one
// sequence).
template <typename PosOf, typename Rows, typename SameKeys>
struct Call {
  const float* q;
  int64_t n_q;
  PosOf pos_of;
  Rows rows;
  SameKeys same_keys;
  const AttentionShape& s;
  float scale;
  AttendHeadsFn heads;
  AttendHeadsFn wide_heads;  // many heads against one segment (null: heads)
  float* out;
  int group, hd;
  int64_t q_stride;

  int64_t lo(int64_t i) const { return first_key(s, pos_of(i)); }
  int64_t keys(int64_t i) const { return pos_of(i) - lo(i) + 1; }
  float sink(int h) const { return s.sinks ? s.sinks[h] : -INFINITY; }
  // A row whose one segment's output is its result (no merge).
  int64_t n_seg(int64_t i) const { return segments(lo(i), keys(i)); }
  Segment seg(int64_t i, int64_t sg) const { return segment(lo(i), keys(i), sg); }
  bool direct(int64_t i) const { return n_seg(i) == 1 && !s.sinks; }
  // Points k_rows / v_rows at segment g of row i's keys, as KV head kvh.
  void gather(int64_t i, Segment g, int kvh, const uint8_t** k_rows, const uint8_t** v_rows) const {
    const int64_t first = lo(i) + g.first;
    for (int64_t t = 0; t < g.count; t++) std::tie(k_rows[t], v_rows[t]) = rows(i, first + t, kvh);
  }
  // Heads [h0, h0 + n) of row i over its segment sg into o / st (st: nullptr when the row has
  // one segment and o is its output).
  void run(const Scratch& sc, int64_t i, int h0, int n, int64_t sg, int64_t seg_keys, float* o, float* st) const {
    const Segment g = seg(i, sg);
    gather(i, g, h0 / group, sc.k_rows, sc.v_rows);
    heads(hd, n, q + i * q_stride + (int64_t)h0 * hd, sc.k_rows, sc.v_rows, g.count, scale, sc.scores, seg_keys, o, st);
  }
};

// Decode: few rows, so work items are (a row's heads that share a KV head, key segment), the
// segments' results merged by a second loop (flash-decoding): every thread streams KV.
template <typename C>
void attend_split(const C& c, int64_t max_seg) {
  const AttentionShape& s = c.s;
  const int hd = c.hd;
  const int64_t items_per_row = s.n_kv_head;
  // Segment results: [n_q][max_seg][n_head] outputs and (max, sum) pairs.
  float* part_o = team_buffer((size_t)(c.n_q * max_seg * s.n_head * (hd + 2)));
  float* part_st = part_o + c.n_q * max_seg * s.n_head * hd;
  // A thread claims a segment's KV heads together: a block holds a position's heads side by
  // side, so one core then reads each block's rows whole and in order.
  parallel_for(c.n_q * items_per_row * max_seg, Split{items_per_row, 0}, [&](int64_t b, int64_t e, int) {
    const Scratch sc = thread_scratch(c.group, kAttentionSegmentKeys, 0, hd);
    for (int64_t w = b; w < e; w++) {
      const int64_t i = w / (items_per_row * max_seg), sg = w / items_per_row % max_seg;
      const int h0 = (int)(w % items_per_row) * c.group;
      if (sg >= c.n_seg(i)) continue;
      if (c.direct(i)) {  // with sinks every row is merged (the sink joins there)
        c.run(sc, i, h0, c.group, 0, kAttentionSegmentKeys, c.out + i * c.q_stride + (int64_t)h0 * hd, nullptr);
      } else {
        const int64_t at = (i * max_seg + sg) * s.n_head + h0;
        c.run(sc, i, h0, c.group, sg, kAttentionSegmentKeys, part_o + at * hd, part_st + at * 2);
      }
    }
  });
  parallel_for(c.n_q * s.n_head, Split{1, 1}, [&](int64_t b, int64_t e, int) {
    for (int64_t w = b; w < e; w++) {
      const int64_t i = w / s.n_head;
      const int h = (int)(w % s.n_head);
      if (c.direct(i)) continue;
      const int64_t at = i * max_seg * s.n_head + h;
      merge_segments(c.n_seg(i), part_o + at * hd, s.n_head * hd, part_st + at * 2, s.n_head * 2, hd,
                     c.out + i * c.q_stride + (int64_t)h * hd, c.sink(h));
    }
  });
}

// Decode with short rows: each (row, head) is an item of its own, for even shares.
template <typename C>
void attend_single_heads(const C& c, int64_t seg_keys) {
  parallel_for(c.n_q * c.s.n_head, Split{2, 0}, [&](int64_t b, int64_t e, int) {
    const Scratch sc = thread_scratch(1, seg_keys, 0, c.hd);
    for (int64_t w = b; w < e; w++) {
      const int64_t i = w / c.s.n_head;
      const int h = (int)(w % c.s.n_head);
      c.run(sc, i, h, 1, 0, seg_keys, c.out + i * c.q_stride + (int64_t)h * c.hd, nullptr);
    }
  });
}

// Rows per block of the blocked path: up to 16, fewer where a block's query heads would not
// fit a few tens of KiB of scratch.
int64_t row_block(int group, int hd) { return std::clamp<int64_t>(8192 / ((int64_t)group * hd), 1, 16); }

// A block's scratch: the per-row kernel's (k_rows, v_rows, scores), the shared call's query
// heads, scores, outputs and stats, and every segment's outputs and stats of every row.
struct BlockScratch {
  Scratch row;
  float *q, *scores, *o, *st, *seg_o, *seg_st;
};
BlockScratch block_scratch(int heads, int group, int hd, int64_t n_seg) {
  const size_t h = (size_t)heads, k = (size_t)kAttentionSegmentKeys;
  const size_t n = h * hd + h * k + h * hd + h * 2 + (size_t)n_seg * h * (hd + 2);
  BlockScratch b{};
  b.row = thread_scratch(group, kAttentionSegmentKeys, 0, hd);
  b.q = own_scratch(2, n);
  b.scores = b.q + h * hd;
  b.o = b.scores + h * k;
  b.st = b.o + h * hd;
  b.seg_o = b.st + h * 2;
  b.seg_st = b.seg_o + (size_t)n_seg * h * hd;
  return b;
}

// Rows [i0, i1) of one sequence, KV head kvh. A segment that several rows hold whole (the same
// absolute keys, whatever each row's first key) runs once for all their query heads (one
// kernel call, each head's floats from its own chains as always), so its K and V come from
// memory once for the block, not once per row; the rest (the diagonal segment, a window's
// partial first one) runs row by row. Each row's segments then merge exactly as when the row
// attends alone.
template <typename C>
void attend_block(const C& c, int64_t i0, int64_t i1, int kvh) {
  const int g = c.group, hd = c.hd, h0 = kvh * g;
  const int64_t nr = i1 - i0, full = kAttentionSegmentKeys;
  int64_t n_seg = 0, a_first = INT64_MAX, a_last = -1;  // absolute segment ids the rows hold
  for (int64_t i = i0; i < i1; i++) {
    n_seg = std::max(n_seg, c.n_seg(i));
    a_first = std::min(a_first, c.lo(i) / kSeg), a_last = std::max(a_last, c.lo(i) / kSeg + c.n_seg(i) - 1);
  }
  BlockScratch b = block_scratch((int)nr * g, g, hd, n_seg);
  const int64_t o_stride = nr * g * hd, st_stride = nr * g * 2;  // between a row's segments
  auto seg_o = [&](int64_t i, int64_t sg) { return b.seg_o + sg * o_stride + (i - i0) * g * hd; };
  auto seg_st = [&](int64_t i, int64_t sg) { return b.seg_st + sg * st_stride + (i - i0) * g * 2; };
  int64_t members[16];
  for (int64_t a = a_first; a <= a_last; a++) {
    int n_m = 0;
    for (int64_t i = i0; i < i1; i++) {
      const int64_t sg = a - c.lo(i) / kSeg;
      if (c.direct(i) || sg < 0 || sg >= c.n_seg(i)) continue;
      if (c.seg(i, sg).count == full)
        members[n_m++] = i;
      else
        c.run(b.row, i, h0, g, sg, full, seg_o(i, sg), seg_st(i, sg));
    }
    if (n_m == 1) {
      const int64_t i = members[0], sg = a - c.lo(i) / kSeg;
      c.run(b.row, i, h0, g, sg, full, seg_o(i, sg), seg_st(i, sg));
    } else if (n_m > 1) {
      for (int m = 0; m < n_m; m++)
        std::memcpy(b.q + (size_t)m * g * hd, c.q + members[m] * c.q_stride + (int64_t)h0 * hd, sizeof(float) * g * hd);
      c.gather(members[0], c.seg(members[0], a - c.lo(members[0]) / kSeg), kvh, b.row.k_rows, b.row.v_rows);
      const AttendHeadsFn many = c.wide_heads && n_m * g >= 8 ? c.wide_heads : c.heads;
      many(hd, n_m * g, b.q, b.row.k_rows, b.row.v_rows, full, c.scale, b.scores, full, b.o, b.st);
      for (int m = 0; m < n_m; m++) {
        const int64_t i = members[m], sg = a - c.lo(i) / kSeg;
        std::memcpy(seg_o(i, sg), b.o + (size_t)m * g * hd, sizeof(float) * g * hd);
        std::memcpy(seg_st(i, sg), b.st + (size_t)m * g * 2, sizeof(float) * g * 2);
      }
    }
  }
  for (int64_t i = i0; i < i1; i++) {
    float* o = c.out + i * c.q_stride + (int64_t)h0 * hd;
    if (c.direct(i)) {
      c.run(b.row, i, h0, g, 0, full, o, nullptr);
      continue;
    }
    const int64_t r = i - i0;
    for (int h = 0; h < g; h++)
      merge_segments(c.n_seg(i), b.seg_o + (r * g + h) * hd, o_stride, b.seg_st + (r * g + h) * 2, st_stride, hd,
                     o + h * hd, c.sink(h0 + h));
  }
}

// Prefill, serving steps, verify: items are (block of consecutive rows of one sequence, KV
// head); rows of different sequences never share a block.
template <typename C>
void attend_blocked(const C& c) {
  const int64_t r_max = row_block(c.group, c.hd);
  std::vector<int64_t>& starts = block_starts_store();
  starts.clear();
  for (int64_t i = 0; i < c.n_q; i++)
    if (starts.empty() || i - starts.back() == r_max || !c.same_keys(starts.back(), i)) starts.push_back(i);
  const int64_t n_blocks = (int64_t)starts.size();
  starts.push_back(c.n_q);
  const int n_kv = c.s.n_kv_head;
  parallel_for(n_blocks * n_kv, Split{1, 0}, [&](int64_t b, int64_t e, int) {
    for (int64_t w = b; w < e; w++) attend_block(c, starts[(size_t)(w / n_kv)], starts[(size_t)(w / n_kv) + 1], (int)(w % n_kv));
  });
}

// The one attention body; the two entry points below differ only in pos_of, rows and
// same_keys, so they compute the same floats in the same order.
template <typename PosOf, typename Rows, typename SameKeys>
void attend(const float* q, int64_t n_q, PosOf pos_of, Rows rows, SameKeys same_keys, DType kv_type,
            const AttentionShape& s, float* out, const CpuKernels& kernels) {
  const float scale = s.scale != 0.0f ? s.scale : 1.0f / std::sqrt((float)s.head_dim);
  const AttendHeadsFn heads = kernels.attend_heads(kv_type, s.head_dim);
  const AttendHeadsFn wide = kernels.attend_wide_heads(kv_type, s.head_dim);
  const Call<PosOf, Rows, SameKeys> c{q,    n_q,  pos_of, rows, same_keys, s, scale, heads, wide, out, s.n_head / s.n_kv_head,
                                      s.head_dim, (int64_t)s.n_head * s.head_dim};
  int64_t max_keys = 0, max_seg = 0;
  for (int64_t i = 0; i < n_q; i++) max_keys = std::max(max_keys, c.keys(i)), max_seg = std::max(max_seg, c.n_seg(i));
  if (!heads) {
    attend_by_head(q, n_q, [&](int64_t i) { return c.keys(i); }, [&](int64_t i) { return c.lo(i); }, rows, kv_type, s,
                   scale, max_keys, out, kernels);
    return;
  }
  // With few rows (decode) there are too few (row, KV head) items for even shares: short rows
  // go as single heads, long ones as (heads, key segment) items.
  if (n_q * s.n_kv_head < 16) {
    if (max_seg > 1)
      attend_split(c, max_seg);
    else if (!s.sinks)
      attend_single_heads(c, std::min(max_keys, kAttentionSegmentKeys));
    else
      attend_blocked(c);  // sinks: every row merges, which the blocked path does
    return;
  }
  attend_blocked(c);
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
      [](int64_t, int64_t) { return true; }, kv_type, s, out, kernels);
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
  attend(
      q, n_q, [pos](int64_t i) { return pos[i]; }, rows, [seq](int64_t i, int64_t j) { return seq[i] == seq[j]; },
      kv_type, s, out, kernels);
}

}  // namespace tandem::cpu
