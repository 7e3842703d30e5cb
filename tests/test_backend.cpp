// The backend seam: ForwardBatch's slot arithmetic and block tables, and the CPU backend's ops
// against the kernels they wrap (bias, per-head norms, the thread count it owns, the KV store
// and attention through a table equal to the contiguous cache).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/forward_batch.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"

namespace tandem {
namespace {

TEST(ForwardBatch, SlotsBlockTablesContextsAndLogitRows) {
  ForwardBatch b(4);
  const std::vector<int32_t> t0 = {7, 2}, t1 = {5, 9, 3};
  // Sequence 0: a decode token at position 6 (block t0[1] = 2, row 2).
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{11}, 6, t0, ForwardBatch::Logits::Last).ok());
  // Sequence 1: a prefill chunk at positions 3..5, no logits (the prompt goes on).
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{20, 21, 22}, 3, t1, ForwardBatch::Logits::None).ok());
  EXPECT_EQ(b.n_tokens(), 4);
  EXPECT_EQ(b.n_seq(), 2);
  EXPECT_EQ(std::vector<int64_t>(b.slots().begin(), b.slots().end()), (std::vector<int64_t>{2 * 4 + 2, 5 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1}));
  EXPECT_EQ(std::vector<int32_t>(b.seq_ids().begin(), b.seq_ids().end()), (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(std::vector<int64_t>(b.context_lens().begin(), b.context_lens().end()), (std::vector<int64_t>{7, 6}));
  EXPECT_EQ(std::vector<int64_t>(b.logit_rows().begin(), b.logit_rows().end()), (std::vector<int64_t>{0}));
  // The flat tables are [n_seq, max_blocks], the shorter padded with -1 (widened after the fact).
  EXPECT_EQ(b.max_blocks(), 3);
  EXPECT_EQ(std::vector<int32_t>(b.block_table(0).begin(), b.block_table(0).end()), (std::vector<int32_t>{7, 2, -1}));
  EXPECT_EQ(std::vector<int32_t>(b.block_table(1).begin(), b.block_table(1).end()), (std::vector<int32_t>{5, 9, 3}));
  EXPECT_EQ(b.slot_block(b.slots()[1]), 5);
  EXPECT_EQ(b.slot_row(b.slots()[1]), 3);
  EXPECT_EQ(b.max_context(), 7);
  EXPECT_FALSE(b.single_run());
}

TEST(ForwardBatch, ErrorsInsteadOfStrayWrites) {
  ForwardBatch b(16);
  const std::vector<int32_t> table = {0};
  EXPECT_FALSE(b.add_sequence(std::vector<int32_t>{1}, 16, table, ForwardBatch::Logits::Last).ok());  // no block
  EXPECT_FALSE(b.add_token(3, 1, 0, false).ok());   // no such sequence
  EXPECT_FALSE(b.add_token(0, 1, -1, false).ok());  // negative position
}

TEST(ForwardBatch, SingleRunAndAllLogits) {
  ForwardBatch b(64);
  const std::vector<int32_t> table = {0};
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{1, 2, 3}, 10, table, ForwardBatch::Logits::All).ok());
  EXPECT_TRUE(b.single_run());
  EXPECT_EQ(std::vector<int64_t>(b.logit_rows().begin(), b.logit_rows().end()), (std::vector<int64_t>{0, 1, 2}));
  ASSERT_TRUE(b.add_token(0, 4, 20, false).ok());  // a gap: no longer one consecutive run
  EXPECT_FALSE(b.single_run());
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = std::sin((float)i * scale) + 0.1f * (float)(i % 7);
  return v;
}

Weight f32_weight(CpuBackend& be, const std::vector<float>& w, int64_t rows, int64_t cols) {
  WeightSource src{"w", DType::F32, reinterpret_cast<const uint8_t*>(w.data()), rows, cols, (size_t)cols * 4};
  auto r = be.prepare_weight(src, true);
  EXPECT_TRUE(r.ok());
  return r.value();
}

TEST(CpuBackend, MatmulBiasAddsToEveryRow) {
  CpuBackend be;
  const int64_t rows = 32, cols = 64, n = 5;
  const std::vector<float> w = ramp(rows * cols, 0.37f), x = ramp(n * cols, 0.11f), bias = ramp(rows, 0.9f);
  const Weight W = f32_weight(be, w, rows, cols);
  const Tensor in = be.upload(x, n, cols), plain = be.new_tensor(n, rows), biased = be.new_tensor(n, rows);
  const Tensor b = be.upload(bias, 1, rows);
  const Product p0{&W, &plain}, p1{&W, &biased, &b};
  be.run_pass(n, [&] {
    be.matmul({&p0, 1}, in);
    be.matmul({&p1, 1}, in);
  });
  const std::vector<float> a(be.read(plain).begin(), be.read(plain).end());
  const std::span<const float> c = be.read(biased);
  for (int64_t t = 0; t < n; t++)
    for (int64_t r = 0; r < rows; r++) EXPECT_EQ(c[t * rows + r], a[t * rows + r] + bias[r]) << t << " " << r;
}

TEST(CpuBackend, RmsnormPerHeadNormsEachHeadOnItsOwn) {
  CpuBackend be;
  const int64_t n = 3, heads = 4, hd = 16;
  const std::vector<float> x = ramp(n * heads * hd, 0.3f), w = ramp(hd, 0.5f);
  const Tensor X = be.upload(x, n, heads * hd), W = be.upload(w, 1, hd), out = be.new_tensor(n, heads * hd);
  be.run_pass(n, [&] { be.rmsnorm(X, W, out, 1e-5f, (int)hd); });
  const std::span<const float> got = be.read(out);
  std::vector<float> want(hd);
  for (int64_t r = 0; r < n * heads; r++) {
    cpu::rmsnorm(x.data() + r * hd, w.data(), want.data(), hd, 1e-5f);
    for (int64_t d = 0; d < hd; d++) ASSERT_EQ(got[r * hd + d], want[d]) << "head row " << r;
  }
}

// The backend's thread count holds inside its passes (its team's size, and OpenMP regions run
// inside a pass), and the caller's OpenMP setting is as it was afterwards: no process-wide state.
TEST(CpuBackend, OwnsItsThreadCount) {
  const int before = omp_get_max_threads();
  for (int threads : {1, 3}) {
    CpuBackend be(CpuBackendOptions{cpu::best_isa(), threads});
    EXPECT_EQ(be.threads(), threads);
    int team_size = -1, op_threads = -1;
    be.run_pass(1, [&] { team_size = cpu::current_team() ? cpu::current_team()->size() : -1; });
    be.run_pass(64, [&] { op_threads = omp_get_max_threads(); });
    EXPECT_EQ(team_size, threads);
    EXPECT_EQ(op_threads, threads);
    EXPECT_EQ(cpu::current_team(), nullptr) << "the team is the pass's only";
  }
  EXPECT_EQ(omp_get_max_threads(), before);
}

// K,V stored at a batch's slots in a pool of blocks (CpuBackend::new_kv_store), then attention
// through the block table, gives exactly what the contiguous cache (one block of the whole
// context) gives, for each KV dtype. The stored rows are the dtype's encoding of K and V (Q8_0:
// ggml's blocks, as the kernels' quantizer writes them), and the f16 and q8_0 caches' outputs
// stay near the f32 cache's.
TEST(CpuBackend, PagedStoreAndAttentionEqualContiguous) {
  CpuBackend be;
  const HeadShape h{4, 2, 64};
  const int64_t n = 21, kv_dim = h.n_kv_head * h.head_dim, q_dim = h.n_head * h.head_dim;
  const std::vector<float> kf = ramp(n * kv_dim, 0.021f), vf = ramp(n * kv_dim, 0.017f);
  const Tensor q = be.upload(ramp(n * q_dim, 0.013f), n, q_dim);
  const Tensor k = be.upload(kf, n, kv_dim), v = be.upload(vf, n, kv_dim);
  std::vector<int32_t> tokens(n, 0);
  auto run = [&](DType dtype, int block_tokens, int64_t n_blocks, std::vector<int32_t> table) {
    const size_t row = kv_row_bytes(dtype, h.n_kv_head, h.head_dim).value();
    auto store = be.new_kv_store(dtype, 2, block_tokens, n_blocks, row);
    EXPECT_TRUE(store.ok());
    const KvStore kv = store.value();
    ForwardBatch b(block_tokens);
    EXPECT_TRUE(b.add_sequence(tokens, 0, table, ForwardBatch::Logits::None).ok());
    const Tensor out = be.new_tensor(n, q_dim);
    be.run_pass(n, [&] {
      be.store_kv(k, v, kv, 1, b);
      be.attention(q, kv, 1, b, h, AttentionParams{0.125f, 0}, out);
    });
    // Each position's K and V bytes (layer 1) against the dtype's encoding of its floats.
    for (int64_t t = 0; t < n; t++) {
      const uint8_t* at = kv.data + (size_t)table[(size_t)(t / block_tokens)] * kv.block_bytes() +
                          (size_t)(t % block_tokens) * row;
      for (int which = 0; which < 2; which++) {
        const float* x = (which == 0 ? kf : vf).data() + t * kv_dim;
        std::vector<uint8_t> want(row);
        if (dtype == DType::Q8_0) cpu::quantize_q8_0_scalar(x, want.data(), kv_dim);
        if (dtype == DType::F16) cpu::f32_to_f16_scalar(x, reinterpret_cast<uint16_t*>(want.data()), kv_dim);
        if (dtype == DType::F32) std::memcpy(want.data(), x, row);
        const uint8_t* got = at + (which == 0 ? kv.k_offset(1) : kv.v_offset(1));
        EXPECT_EQ(std::vector<uint8_t>(got, got + row), want) << dtype_name(dtype) << " position " << t << " " << "KV"[which];
      }
    }
    return std::vector<float>(be.read(out).begin(), be.read(out).end());
  };
  const std::vector<float> f32 = run(DType::F32, 32, 1, {0});
  for (DType dtype : {DType::F16, DType::Q8_0, DType::F32}) {
    const std::vector<float> contiguous = run(dtype, 32, 1, {0});
    const std::vector<float> paged = run(dtype, 4, 8, {6, 1, 7, 0, 3, 5});  // blocks out of order
    ASSERT_EQ(contiguous.size(), paged.size());
    for (size_t i = 0; i < contiguous.size(); i++) {
      ASSERT_EQ(contiguous[i], paged[i]) << dtype_name(dtype) << " " << i;
      ASSERT_NEAR(contiguous[i], f32[i], dtype == DType::Q8_0 ? 2e-2 : 2e-3) << dtype_name(dtype) << " " << i;
    }
  }
}

// A q8_0 store is ggml's block_q8_0 rows: 34 bytes per 32 elements, head h of a row at
// h * head_dim / 32 * 34 (the kernels read it there); half an f16 store, plus the scales.
TEST(CpuBackend, Q8_0KvStoreSizes) {
  EXPECT_EQ(kv_row_bytes(DType::Q8_0, 3, 64).value(), 3u * 2 * 34);
  EXPECT_EQ(kv_row_bytes(DType::F16, 3, 64).value(), 3u * 64 * 2);
  EXPECT_FALSE(kv_row_bytes(DType::Q8_0, 2, 48).ok());  // heads must be whole blocks
  CpuBackend be;
  auto kv = be.new_kv_store(DType::Q8_0, 30, 16, 10, kv_row_bytes(DType::Q8_0, 3, 64).value());
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv.value().bytes(), 10u * 30 * 2 * 16 * 204);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// --exact-products names whole parts of a tensor name, so "output" (the head) is not
// attn_output, and a layer's part matches in every layer.
TEST(CpuBackend, ExactProductPatternsNameWholeComponents) {
  EXPECT_TRUE(name_has_components("output.weight", "output"));
  EXPECT_FALSE(name_has_components("blk.0.attn_output.weight", "output"));
  EXPECT_TRUE(name_has_components("blk.12.ffn_down.weight", "ffn_down"));
  EXPECT_FALSE(name_has_components("blk.12.ffn_down_exps.weight", "ffn_down"));
  EXPECT_TRUE(name_has_components("token_embd.weight", "token_embd"));
  EXPECT_TRUE(name_has_components("blk.3.attn_q.weight", "blk.3.attn_q"));
  EXPECT_FALSE(name_has_components("blk.13.attn_q.weight", "3.attn_q"));
  EXPECT_FALSE(name_has_components("output.weight", ""));
  EXPECT_FALSE(name_has_components("output", "output.weight"));
}

}  // namespace
}  // namespace tandem
