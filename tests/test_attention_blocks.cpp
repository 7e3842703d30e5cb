// The blocked attention path (kernels/cpu/attention.cpp: rows of one sequence share each key
// segment they hold whole) against the plain one: a batch mixing sequences, with rows across
// segment edges (256, 512 keys), row blocks (16) and sequence changes in the middle of a block,
// rows of one sequence split around another's, sliding windows (whose rows never share),
// attention sinks and every KV type on every ISA. Each row equals, bit for bit, that row
// attending alone (decode), and a float64 evaluation within rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_blocks.h"

#include "paged_copy.h"

namespace tandem::cpu {
namespace {

using kernel_test::PagedCopy;
using kernel_test::paged_copy;

// One sequence's cache: n_ctx rows of K and V as the cache holds them (kv_type bytes) and as
// floats (what the reference multiplies), paged with a scrambled block order.
struct SeqCache {
  std::vector<float> k, v;
  std::vector<uint8_t> kb, vb;
  PagedCopy paged;
};

SeqCache make_cache(int64_t n_ctx, int64_t kvd, DType kv_type, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  SeqCache c;
  c.k.resize((size_t)(n_ctx * kvd)), c.v.resize((size_t)(n_ctx * kvd));
  for (auto* vec : {&c.k, &c.v})
    for (auto& e : *vec) e = nd(rng);
  if (kv_type == DType::Q8_0) {
    c.kb.resize(c.k.size() / kQK * sizeof(BlockQ8_0)), c.vb.resize(c.kb.size());
    quantize_q8_0(c.k.data(), c.kb.data(), (int64_t)c.k.size());
    quantize_q8_0(c.v.data(), c.vb.data(), (int64_t)c.v.size());
    EXPECT_TRUE(dequantize_row(DType::Q8_0, c.kb.data(), c.k.data(), (int64_t)c.k.size()));
    EXPECT_TRUE(dequantize_row(DType::Q8_0, c.vb.data(), c.v.data(), (int64_t)c.v.size()));
  } else if (kv_type == DType::F16) {
    c.kb.resize(c.k.size() * 2), c.vb.resize(c.v.size() * 2);
    for (size_t j = 0; j < c.k.size(); j++) {
      const uint16_t hk = fp32_to_fp16(c.k[j]), hv = fp32_to_fp16(c.v[j]);
      std::memcpy(&c.kb[j * 2], &hk, 2), std::memcpy(&c.vb[j * 2], &hv, 2);
      c.k[j] = fp16_to_fp32(hk), c.v[j] = fp16_to_fp32(hv);
    }
  } else {
    c.kb.resize(c.k.size() * 4), c.vb.resize(c.v.size() * 4);
    std::memcpy(c.kb.data(), c.k.data(), c.kb.size()), std::memcpy(c.vb.data(), c.v.data(), c.vb.size());
  }
  c.paged = paged_copy(c.kb, c.vb, n_ctx, 16, [](int64_t b, int64_t n) { return (b * 7) % n; });
  return c;
}

// softmax(q k^T * scale, with the sink in the denominator) v over keys [lo, p], in float64.
double reference(const std::vector<float>& q, const SeqCache& c, int64_t i, int h, int64_t p, const AttentionShape& s,
                 int j) {
  const int hd = s.head_dim, kvh = h / (s.n_head / s.n_kv_head);
  const int64_t qd = (int64_t)s.n_head * hd, kvd = (int64_t)s.n_kv_head * hd, lo = first_key(s, p);
  std::vector<double> sc((size_t)(p - lo + 1));
  double mx = s.sinks ? s.sinks[h] : -1e300, sum = 0;
  for (int64_t t = lo; t <= p; t++) {
    double d = 0;
    for (int e = 0; e < hd; e++) d += (double)q[(size_t)(i * qd + h * hd + e)] * c.k[(size_t)(t * kvd + kvh * hd + e)];
    mx = std::max(mx, sc[(size_t)(t - lo)] = d * s.scale);
  }
  for (auto& e : sc) sum += (e = std::exp(e - mx));
  if (s.sinks) sum += std::exp(s.sinks[h] - mx);
  double o = 0;
  for (int64_t t = lo; t <= p; t++) o += sc[(size_t)(t - lo)] / sum * c.v[(size_t)(t * kvd + kvh * hd + j)];
  return o;
}

TEST(Kernels, BlockedAttentionEqualsEachRowAloneAcrossSequences) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  struct Shape {
    int n_head, n_kv_head, hd;
  };
  // (sequence, position) of each query row: A crosses 256 and 512 keys over 3 blocks of 16,
  // B is short (one segment), A goes on after B, C is long and alone in its blocks.
  std::vector<int> seq;
  std::vector<int64_t> pos;
  auto add = [&](int s, int64_t p0, int64_t n) {
    for (int64_t i = 0; i < n; i++) seq.push_back(s), pos.push_back(p0 + i);
  };
  add(0, 490, 30), add(1, 5, 7), add(0, 520, 20), add(2, 800, 5);
  const int64_t n_ctx[3] = {540, 12, 805};
  const int64_t n_q = (int64_t)seq.size();
  for (const Shape sh : {Shape{6, 2, 64}, Shape{8, 2, 128}, Shape{4, 1, 256}})
    for (int64_t window : {int64_t{0}, int64_t{300}})
      for (bool sinks : {false, true})
        for (DType kv_type : {DType::F32, DType::F16, DType::Q8_0}) {
          const int64_t kvd = (int64_t)sh.n_kv_head * sh.hd, qd = (int64_t)sh.n_head * sh.hd;
          std::vector<float> sink_logits((size_t)sh.n_head);
          for (auto& e : sink_logits) e = nd(rng);
          const AttentionShape s{sh.n_head, sh.n_kv_head, sh.hd, 0.0625f, window, sinks ? sink_logits.data() : nullptr};
          std::vector<SeqCache> caches;
          for (int64_t n : n_ctx) caches.push_back(make_cache(n, kvd, kv_type, rng));
          const PagedKvView views[3] = {caches[0].paged.view, caches[1].paged.view, caches[2].paged.view};
          std::vector<float> q((size_t)(n_q * qd));
          for (auto& e : q) e = nd(rng);
          for (Isa isa : supported_isas()) {
            const auto kern = kernels_for(isa);
            const std::string at = std::string(isa_name(isa)) + " " + std::string(dtype_name(kv_type)) + " head_dim " +
                                   std::to_string(sh.hd) + " window " + std::to_string(window) +
                                   (sinks ? " sinks" : "");
            std::vector<float> out((size_t)(n_q * qd)), one((size_t)qd);
            attention_paged(q.data(), n_q, pos.data(), seq.data(), views, kv_type, s, out.data(), kern);
            for (int64_t i = 0; i < n_q; i++) {
              attention_paged(q.data() + i * qd, 1, &pos[(size_t)i], &seq[(size_t)i], views, kv_type, s, one.data(), kern);
              for (int64_t j = 0; j < qd; j++)
                ASSERT_EQ(one[(size_t)j], out[(size_t)(i * qd + j)]) << "row " << i << " alone, " << at;
              if (i % 7 != 0) continue;  // the float64 check on a sample of rows
              for (int h = 0; h < sh.n_head; h++)
                for (int j = 0; j < sh.hd; j += 5)
                  ASSERT_NEAR(out[(size_t)(i * qd + h * sh.hd + j)],
                              reference(q, caches[(size_t)seq[(size_t)i]], i, h, pos[(size_t)i], s, j), 2e-5)
                      << at << " row " << i << " head " << h;
            }
          }
        }
}

}  // namespace
}  // namespace tandem::cpu
