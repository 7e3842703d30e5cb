// The KV cache's kernels: the Q8_0 quantizer that writes K,V rows (GGML's block bytes on every
// ISA), axpy over q8_0 rows, and attention over a q8_0 cache, every family's head size and
// sliding windows on wide heads.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed_float.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"

#include "paged_copy.h"

namespace tandem::cpu {
namespace {

using kernel_test::PagedCopy;
using kernel_test::paged_copy;

std::vector<uint8_t> quantize_q8_0_with(QuantizeQ8_0Fn f, const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / kQK * sizeof(BlockQ8_0));
  f(x.data(), out.data(), (int64_t)x.size());
  return out;
}

// Two blocks whose bytes are worked out by hand (and agree with the gguf package's Q8_0, itself
// bit-exact with ggml's quantize_row_q8_0_ref): block 0 has amax 127, so d = 1 and the halves
// show the rounding (away from zero: 2.5 -> 3, -126.5 -> -127, 0.5 -> 1, where rounding to even
// gives 2, -126, 0); block 1 is 0.5 j, so d = 15.5 / 127 = fp16 0x2FD0 and q = round(4.0968 j).
// The layout is ggml's block_q8_0: d (fp16, little-endian), then 32 int8; the dequantizer reads
// it back. An all-zero block has d = 0 and q = 0.
TEST(Kernels, Q8_0QuantizerWritesGgmlBlocks) {
  std::vector<float> x = {127.0f, -126.5f, 2.5f, -2.5f, 0.5f, -0.5f, std::nextafter(0.5f, 0.0f),
                          std::nextafter(1.5f, 0.0f), -0.0f, 3.25f};
  for (int j = 10; j < 32; j++) x.push_back((float)j - 16.5f);
  for (int j = 0; j < 32; j++) x.push_back(0.5f * (float)j);
  for (int j = 0; j < 32; j++) x.push_back(0.0f);
  const std::vector<int8_t> q0 = {127, -127, 3,  -3, 1,  -1, 0,  1,  0,  3,  -7, -6, -5, -4, -3, -2,
                                  -1,  1,    2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15};
  const std::vector<int8_t> q1 = {0,  4,  8,  12, 16, 20, 25,  29,  33,  37,  41,  45,  49,  53,  57,  61,
                                  66, 70, 74, 78, 82, 86, 90, 94, 98, 102, 107, 111, 115, 119, 123, 127};
  std::vector<uint8_t> want = {0x00, 0x3C};
  for (int8_t q : q0) want.push_back((uint8_t)q);
  want.push_back(0xD0), want.push_back(0x2F);
  for (int8_t q : q1) want.push_back((uint8_t)q);
  want.insert(want.end(), 34, 0);
  ASSERT_EQ(want.size(), 3 * sizeof(BlockQ8_0));
  for (Isa isa : supported_isas()) {
    const std::vector<uint8_t> got = quantize_q8_0_with(kernels_for(isa).quantize_q8_0, x);
    ASSERT_EQ(got, want) << isa_name(isa);
    std::vector<float> back(x.size());
    ASSERT_TRUE(dequantize_row(DType::Q8_0, got.data(), back.data(), (int64_t)back.size()));
    EXPECT_EQ(back[1], -127.0f);
    EXPECT_EQ(back[32 + 31], fp16_to_fp32(0x2FD0) * 127.0f);
  }
  EXPECT_EQ(quantize_q8_0_with(quantize_q8_0, x), want);  // the best level, as the KV store calls it
}

// Every level writes the scalar twin's bytes: random blocks at scales from subnormal to 1e30,
// blocks of exact ties (amax 127 * 2^e, so id = 2^-e and (k + 1/2) 2^e lands on a half), and
// blocks holding zeros, signed zeros, infinities and NaNs. Blocks whose d fits fp16 round-trip
// within about half a step: |x - d q| <= d / 2 plus the fp16 rounding of d (127 d 2^-11).
TEST(Kernels, Q8_0QuantizerSameBytesOnEveryIsa) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  std::vector<float> x;
  for (float scale : {1.0f, 1e-3f, 37.0f, 1e-20f, 1e-39f, 1e30f})
    for (int b = 0; b < 8; b++)
      for (int j = 0; j < kQK; j++) x.push_back(scale * nd(rng));
  const size_t finite = x.size();
  for (int e : {-20, -3, 0, 4}) {
    for (int j = 0; j < kQK; j++) {
      const int k = (int)(rng() % 254) - 127;  // (k + 1/2) with |k + 1/2| < 127
      x.push_back(std::ldexp(j == 0 ? 127.0f : (float)k + 0.5f, e));
    }
  }
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -3.0f, 1e-45f};
  for (int b = 0; b < 6; b++)
    for (int j = 0; j < kQK; j++) x.push_back(rng() % 4 == 0 ? specials[(b + j) % 8] : nd(rng));
  const std::vector<uint8_t> want = quantize_q8_0_with(quantize_q8_0_scalar, x);
  for (Isa isa : supported_isas()) {
    for (size_t n : {x.size(), (size_t)kQK, (size_t)3 * kQK}) {
      const std::vector<float> part(x.begin(), x.begin() + (ptrdiff_t)n);
      const std::vector<uint8_t> got = quantize_q8_0_with(kernels_for(isa).quantize_q8_0, part);
      for (size_t i = 0; i < got.size(); i++)
        ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " block " << i / 34 << " byte " << i % 34;
    }
  }
  const auto* blocks = reinterpret_cast<const BlockQ8_0*>(want.data());
  int checked = 0;
  for (size_t b = 0; b < finite / kQK; b++) {
    float amax = 0;
    for (int j = 0; j < kQK; j++) amax = std::max(amax, std::fabs(x[b * kQK + j]));
    if (amax / 127.0f > 65504.0f) {  // past fp16: d is infinite, in ggml too
      ASSERT_EQ(blocks[b].d, 0x7C00);
      continue;
    }
    checked++;
    const float d = fp16_to_fp32(blocks[b].d);
    for (int j = 0; j < kQK; j++) {
      const float back = d * blocks[b].qs[j];
      // Scales below fp16's range store d = 0 (or a subnormal): the block decodes to ~0.
      const double tol = 0.5 * amax / 127.0 + 127.0 * amax / 127.0 / 2048.0 + 127.0 * 6e-8;
      ASSERT_LE(std::fabs((double)back - x[b * kQK + j]), tol) << "block " << b << " element " << j;
    }
  }
  EXPECT_EQ(checked, 40);
  // The exact ties round away from zero: q = k + 1 for k >= 0, k for k < 0.
  for (size_t b = finite / kQK; b < finite / kQK + 4; b++)
    for (int j = 1; j < kQK; j++) {
      const float t = x[b * kQK + j] / std::ldexp(1.0f, (int)std::ilogb(x[b * kQK]) - 6);  // k + 1/2
      ASSERT_EQ(blocks[b].qs[j], (int)(t > 0 ? t + 0.5f : t - 0.5f)) << "tie " << t;
    }
}

// y += a x over a Q8_0 row equals the same kernel level's y += a x over the row's dequantized
// floats, bit for bit (each element is d * q exactly): the generic attention path's sums over a
// Q8_0 cache are its sums over an F32 cache of the same values.
TEST(Kernels, Q8_0AxpyEqualsF32AxpyOfDequantizedEveryIsa) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  for (int64_t n : {32, 64, 96, 128, 320}) {
    std::vector<float> x(n), y0(n);
    for (int64_t i = 0; i < n; i++) x[i] = nd(rng), y0[i] = nd(rng);
    const std::vector<uint8_t> q = quantize_q8_0_with(quantize_q8_0_scalar, x);
    std::vector<float> deq(n);
    ASSERT_TRUE(dequantize_row(DType::Q8_0, q.data(), deq.data(), n));
    for (Isa isa : supported_isas()) {
      ASSERT_NE(kernels_for(isa).axpy(DType::Q8_0), nullptr);
      std::vector<float> got(y0), want(y0);
      kernels_for(isa).axpy(DType::Q8_0)(0.37f, q.data(), got.data(), n);
      kernels_for(isa).axpy(DType::F32)(0.37f, deq.data(), want.data(), n);
      for (int64_t i = 0; i < n; i++) ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " n=" << n << " i=" << i;
      EXPECT_NEAR(kernels_for(isa).row_dot(DType::Q8_0)(q.data(), y0.data(), n), f32_dot_scalar(deq.data(), y0.data(), n),
                  1e-4 * n);
    }
  }
}

// Attention over a Q8_0 K/V cache: against a float64 evaluation on the dequantized values,
// for head sizes the SIMD kernels take (64, 96, 128, 256) and one the generic path takes (32), GQA
// (3 and 4 query heads per KV head), rows on both sides of the 256-key segment boundary, few
// rows (decode) and many (prefill), on every ISA level. Bit for bit: each row alone equals the
// rows together (decode == prefill), the paged cache (blocks out of order) equals the
// contiguous one, and wherever the kernel widens rows itself (the SIMD kernels; the scalar
// path, which dequantizes) the result equals the same kernel over an F32 cache of the
// dequantized values.
TEST(Kernels, AttentionOverQ8_0CacheEveryIsa) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  struct Case {
    int64_t n_ctx, pos0, n_q;
    int n_head, n_kv_head;
  };
  for (const Case c : {Case{40, 21, 19, 6, 2}, Case{300, 250, 19, 8, 2}, Case{600, 500, 3, 6, 2}, Case{600, 598, 2, 8, 2}})
    for (int hd : {32, 64, 96, 128, 256}) {
      const AttentionShape s{c.n_head, c.n_kv_head, hd};
      const int group = c.n_head / c.n_kv_head;
      const int64_t kvd = (int64_t)c.n_kv_head * hd, qd = (int64_t)c.n_head * hd, n_q = c.n_q, pos0 = c.pos0;
      std::vector<float> k(c.n_ctx * kvd), v(c.n_ctx * kvd), q(n_q * qd);
      for (auto* vec : {&k, &v, &q})
        for (auto& e : *vec) e = nd(rng);
      for (size_t j = 0; j < k.size(); j += 7) k[j] *= 4.0f;  // uneven block scales
      const std::vector<uint8_t> kq = quantize_q8_0_with(quantize_q8_0_scalar, k), vq = quantize_q8_0_with(quantize_q8_0_scalar, v);
      std::vector<float> kd(k.size()), vd(v.size());
      ASSERT_TRUE(dequantize_row(DType::Q8_0, kq.data(), kd.data(), (int64_t)kd.size()));
      ASSERT_TRUE(dequantize_row(DType::Q8_0, vq.data(), vd.data(), (int64_t)vd.size()));
      // The paged copy: 16-token blocks, placed in reverse order in a pool with K then V per block.
      const PagedCopy paged_kv = paged_copy(kq, vq, c.n_ctx, 16, [](int64_t b, int64_t n) { return n - 1 - b; });
      const PagedKvView& view = paged_kv.view;
      std::vector<int64_t> pos(n_q);
      std::vector<int> seq(n_q, 0);
      for (int64_t i = 0; i < n_q; i++) pos[i] = pos0 + i;
      for (Isa isa : supported_isas()) {
        const auto kern = kernels_for(isa);
        const std::string at = std::string(isa_name(isa)) + " head_dim " + std::to_string(hd) + " pos0 " + std::to_string(pos0);
        std::vector<float> out(n_q * qd), as_f32(n_q * qd), paged(n_q * qd), one(qd);
        attention(q.data(), kq.data(), vq.data(), DType::Q8_0, n_q, pos0, s, out.data(), kern);
        attention(q.data(), kd.data(), vd.data(), DType::F32, n_q, pos0, s, as_f32.data(), kern);
        attention_paged(q.data(), n_q, pos.data(), seq.data(), &view, DType::Q8_0, s, paged.data(), kern);
        const bool widened_in_kernel = isa == Isa::Scalar || hd != 32;
        for (int64_t j = 0; j < n_q * qd; j++) {
          ASSERT_EQ(paged[j], out[j]) << "paged, " << at;
          if (widened_in_kernel) {
            ASSERT_EQ(as_f32[j], out[j]) << "F32 of the dequantized values, " << at;
          }
        }
        for (int64_t i = 0; i < n_q; i++) {
          attention(q.data() + i * qd, kq.data(), vq.data(), DType::Q8_0, 1, pos0 + i, s, one.data(), kern);
          for (int64_t j = 0; j < qd; j++) ASSERT_EQ(one[j], out[i * qd + j]) << "row " << i << " alone, " << at;
          for (int h = 0; h < c.n_head; h++) {
            const int kvh = h / group;
            std::vector<double> sc(pos0 + i + 1);
            double mx = -1e30, sum = 0;
            for (int64_t t = 0; t <= pos0 + i; t++) {
              double d = 0;
              for (int j = 0; j < hd; j++) d += (double)q[i * qd + h * hd + j] * kd[t * kvd + kvh * hd + j];
              sc[t] = d / std::sqrt((double)hd);
              mx = std::max(mx, sc[t]);
            }
            for (auto& e : sc) sum += (e = std::exp(e - mx));
            for (int j = 0; j < hd; j++) {
              double o = 0;
              for (int64_t t = 0; t <= pos0 + i; t++) o += sc[t] / sum * vd[t * kvd + kvh * hd + j];
              ASSERT_NEAR(out[i * qd + h * hd + j], o, 2e-5) << at << " row " << i << " head " << h;
            }
          }
        }
      }
    }
}

// The SIMD levels take every head size the supported families use (Llama/Qwen 64 and 128,
// Phi-3 96, Gemma 3 256) for every cache type; others go to the generic path.
TEST(Kernels, SimdAttentionTakesEveryFamilysHeadSize) {
  for (Isa isa : supported_isas()) {
    if (isa == Isa::Scalar) continue;
    for (DType kv : {DType::F32, DType::F16, DType::Q8_0}) {
      for (int hd : {64, 96, 128, 256}) {
        const AttendHeadsFn f = kernels_for(isa).attend_heads(kv, hd);
        EXPECT_NE(f, nullptr) << isa_name(isa) << " " << dtype_name(kv) << " head_dim " << hd;
      }
      for (int hd : {8, 32, 80, 192}) {
        const AttendHeadsFn f = kernels_for(isa).attend_heads(kv, hd);
        EXPECT_EQ(f, nullptr) << isa_name(isa) << " " << dtype_name(kv) << " head_dim " << hd;
      }
    }
  }
}

// Gemma 3's local layers (head_dim 256, one KV head for 4 query heads, a sliding window) and a
// Phi-3-sized head (96), with a score scale that is not 1 / sqrt(head_dim), on every level and
// cache type: against a float64 evaluation over each row's window, and bit for bit a row alone
// equals the rows together (decode == prefill) and the paged cache equals the contiguous one.
// Windows of 300 keys span two 256-key segments; rows before the window fills see them all.
TEST(Kernels, WindowedAttentionOnWideHeadsEveryIsa) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  struct Case {
    int64_t n_ctx, pos0, n_q, window;
    int n_head, n_kv_head, hd;
  };
  for (const Case c : {Case{700, 660, 19, 300, 4, 1, 256}, Case{700, 690, 2, 300, 4, 1, 256},
                       Case{200, 150, 40, 64, 4, 1, 256}, Case{650, 600, 3, 520, 6, 2, 96}, Case{90, 0, 40, 17, 6, 2, 96}})
    for (DType kv_type : {DType::F32, DType::F16, DType::Q8_0}) {
      const AttentionShape s{c.n_head, c.n_kv_head, c.hd, 0.0625f, c.window};
      const int group = c.n_head / c.n_kv_head, hd = c.hd;
      const int64_t kvd = (int64_t)c.n_kv_head * hd, qd = (int64_t)c.n_head * hd, n_q = c.n_q, pos0 = c.pos0;
      std::vector<float> k(c.n_ctx * kvd), v(c.n_ctx * kvd), q(n_q * qd);
      for (auto* vec : {&k, &v, &q})
        for (auto& e : *vec) e = nd(rng);
      // The cache's bytes, and the floats they hold (what the reference multiplies).
      std::vector<uint8_t> kb, vb;
      if (kv_type == DType::Q8_0) {
        kb = quantize_q8_0_with(quantize_q8_0_scalar, k), vb = quantize_q8_0_with(quantize_q8_0_scalar, v);
        ASSERT_TRUE(dequantize_row(DType::Q8_0, kb.data(), k.data(), (int64_t)k.size()));
        ASSERT_TRUE(dequantize_row(DType::Q8_0, vb.data(), v.data(), (int64_t)v.size()));
      } else if (kv_type == DType::F16) {
        kb.resize(k.size() * 2), vb.resize(v.size() * 2);
        for (size_t j = 0; j < k.size(); j++) {
          const uint16_t hk = fp32_to_fp16(k[j]), hv = fp32_to_fp16(v[j]);
          std::memcpy(&kb[j * 2], &hk, 2), std::memcpy(&vb[j * 2], &hv, 2);
          k[j] = fp16_to_fp32(hk), v[j] = fp16_to_fp32(hv);
        }
      } else {
        kb.resize(k.size() * 4), vb.resize(v.size() * 4);
        std::memcpy(kb.data(), k.data(), kb.size()), std::memcpy(vb.data(), v.data(), vb.size());
      }
      // 7 is prime to every block count here, so (b * 7) % n is a permutation
      const PagedCopy paged_kv = paged_copy(kb, vb, c.n_ctx, 16, [](int64_t b, int64_t n) { return (b * 7) % n; });
      const PagedKvView& view = paged_kv.view;
      std::vector<int64_t> pos(n_q);
      std::vector<int> seq(n_q, 0);
      for (int64_t i = 0; i < n_q; i++) pos[i] = pos0 + i;
      for (Isa isa : supported_isas()) {
        const auto kern = kernels_for(isa);
        const std::string at = std::string(isa_name(isa)) + " " + std::string(dtype_name(kv_type)) + " head_dim " +
                               std::to_string(hd) + " window " + std::to_string(c.window) + " pos0 " + std::to_string(pos0);
        std::vector<float> out(n_q * qd), paged(n_q * qd), one(qd);
        attention(q.data(), kb.data(), vb.data(), kv_type, n_q, pos0, s, out.data(), kern);
        attention_paged(q.data(), n_q, pos.data(), seq.data(), &view, kv_type, s, paged.data(), kern);
        for (int64_t j = 0; j < n_q * qd; j++) ASSERT_EQ(paged[j], out[j]) << "paged, " << at;
        for (int64_t i = 0; i < n_q; i++) {
          attention(q.data() + i * qd, kb.data(), vb.data(), kv_type, 1, pos0 + i, s, one.data(), kern);
          for (int64_t j = 0; j < qd; j++) ASSERT_EQ(one[j], out[i * qd + j]) << "row " << i << " alone, " << at;
          const int64_t p = pos0 + i, lo = p >= c.window ? p - c.window + 1 : 0;
          for (int h = 0; h < c.n_head; h++) {
            const int kvh = h / group;
            std::vector<double> sc(p - lo + 1);
            double mx = -1e30, sum = 0;
            for (int64_t t = lo; t <= p; t++) {
              double d = 0;
              for (int j = 0; j < hd; j++) d += (double)q[i * qd + h * hd + j] * k[t * kvd + kvh * hd + j];
              sc[t - lo] = d * 0.0625;
              mx = std::max(mx, sc[t - lo]);
            }
            for (auto& e : sc) sum += (e = std::exp(e - mx));
            for (int j = 0; j < hd; j++) {
              double o = 0;
              for (int64_t t = lo; t <= p; t++) o += sc[t - lo] / sum * v[t * kvd + kvh * hd + j];
              ASSERT_NEAR(out[i * qd + h * hd + j], o, 2e-5) << at << " row " << i << " head " << h;
            }
          }
        }
      }
    }
}

}  // namespace
}  // namespace tandem::cpu

