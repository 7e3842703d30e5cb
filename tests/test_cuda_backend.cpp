// The CUDA backend op by op against the CPU backend on random data: norms (in place, per
// head), the residual add (scaled), RoPE (adjacent pairs and NeoX halves), SwiGLU and GeGLU,
// products with bias, scaled embeddings, the K,V store (f32, f16, GGML q8_0 bytes), paged
// attention over shuffled blocks (decode split-K, prefill tiles, a mixed batch, GQA, head_dim
// 64/96/128/256, every cache type, a score scale, sliding windows), logits (scaled,
// soft-capped), graph replay and that a new parameter captures a new graph; and the host-side
// batch staging, which runs without a GPU. Each GPU test skips, saying why, where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_batch.h"
#include "core/fp16.h"
#include "cuda_gpu.h"

namespace tandem {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// Host floats into a device tensor, in stream order with the backend's kernels (a copy on
// another stream could overtake a kernel still reading the tensor).
void to_device(CudaBackend& be, const Tensor& t, const std::vector<float>& v) {
  ASSERT_EQ(cudaMemcpyAsync(t.data, v.data(), v.size() * 4, cudaMemcpyHostToDevice, be.stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(be.stream()), cudaSuccess);
}

std::vector<float> host(Backend& be, const Tensor& t) {
  const std::span<const float> s = be.read(t);
  return std::vector<float>(s.begin(), s.end());
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const float d = std::fabs(got[i] - want[i]) / std::max(1.0f, std::fabs(want[i]));
    if (!(d <= worst)) worst = d, at = i;  // NaN counts as worst
  }
  EXPECT_LE(worst, tol) << what << ": worst at " << at << ": " << got[at] << " vs " << want[at];
}

CpuBackend cpu_reference() { return CpuBackend(CpuBackendOptions{cpu::best_isa(), 2, false, {}}); }

// ---- host-side staging (no GPU needed) ----

TEST(CudaBatchStaging, TilesAreRunsOfOneSequenceAtMostTileRows) {
  std::vector<int32_t> seq(40, 0);
  for (int i = 20; i < 23; i++) seq[(size_t)i] = 1;
  for (int i = 23; i < 40; i++) seq[(size_t)i] = 0;  // sequence 0 again: a run of its own
  const std::vector<int32_t> tiles = attention_tiles(seq);
  EXPECT_EQ(tiles, (std::vector<int32_t>{0, 16, 16, 4, 20, 3, 23, 16, 39, 1}));
}

TEST(CudaBatchStaging, ImageHoldsEveryArrayAndPaddedTables) {
  ForwardBatch b(16);
  const std::vector<int32_t> t0 = {7, 2, 9, 11, 3}, t1 = {5};
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{11}, 70, t0, ForwardBatch::Logits::Last).ok());
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{20, 21, 22, 23, 24, 25}, 3, t1, ForwardBatch::Logits::Last).ok());
  BatchStager st;
  const BatchOffsets o = st.add_batch(b);
  EXPECT_EQ(o.n_tokens, 7);
  EXPECT_EQ(o.n_seq, 2);
  EXPECT_EQ(o.table_stride, 8);  // 5 blocks padded to a power of two
  EXPECT_EQ(o.max_seq_tokens, 6);
  EXPECT_FALSE(o.decode());  // a 6-token chunk: the tiled kernel
  EXPECT_EQ(o.n_tiles, 2);
  const uint8_t* img = st.image().data();
  auto i32 = [&](size_t off, size_t i) {
    int32_t v;
    std::memcpy(&v, img + off + 4 * i, 4);
    return v;
  };
  EXPECT_EQ(i32(o.tokens, 0), 11);
  EXPECT_EQ(i32(o.positions, 0), 70);
  EXPECT_EQ(i32(o.positions, 6), 8);
  EXPECT_EQ(i32(o.seq_ids, 6), 1);
  int64_t slot;
  std::memcpy(&slot, img + o.slots, 8);
  EXPECT_EQ(slot, 3 * 16 + 6);  // position 70: block t0[4] = 3, row 6
  EXPECT_EQ(i32(o.tables, 4), 3);
  EXPECT_EQ(i32(o.tables, 5), -1);
  EXPECT_EQ(i32(o.tables, 8), 5);
  EXPECT_EQ(o.slots % 8, 0u);
  // A decode step of the same sequences has the same shape whatever the positions.
  ForwardBatch d1(16), d2(16);
  ASSERT_TRUE(d1.add_sequence(std::vector<int32_t>{1}, 64, t0, ForwardBatch::Logits::Last).ok());
  ASSERT_TRUE(d2.add_sequence(std::vector<int32_t>{2}, 79, t0, ForwardBatch::Logits::Last).ok());
  BatchStager s1, s2;
  const BatchOffsets a = s1.add_batch(d1), c = s2.add_batch(d2);
  EXPECT_TRUE(a.decode());
  EXPECT_EQ(a.table_stride, c.table_stride);
  EXPECT_EQ(a.tables, c.tables);
  EXPECT_EQ(s1.image().size(), s2.image().size());
}

// ---- element-wise ops ----

TEST(CudaBackend, RmsnormRowsAndHeadsAndResidualMatchCpu) {
  NEED_GPU(g);
  CpuBackend c = cpu_reference();
  const int64_t n = 5, d = 576, hd = 64;
  const std::vector<float> x = randn(n * d, 1), dx = randn(n * d, 2), w = randn(d, 3), wh = randn(hd, 4);
  std::vector<std::vector<float>> outs[2];
  int i = 0;
  for (Backend* be : {(Backend*)&c, (Backend*)&g}) {
    Tensor X = be->upload(x, n, d), D = be->upload(dx, n, d), W = be->upload(w, 1, d), WH = be->upload(wh, 1, hd);
    Tensor o1 = be->new_tensor(n, d), o2 = be->new_tensor(n, d), o3 = be->new_tensor(n, d), o4 = be->new_tensor(n, d);
    Tensor P = be->upload(x, n, d), PH = be->upload(dx, n, d);  // normed in place
    be->run_pass(n, [&] {
      be->rmsnorm(X, W, o1, 1e-5f);
      be->rmsnorm(X, WH, o2, 1e-6f, (int)hd);
      be->rmsnorm(P, W, P, 1e-5f);              // Gemma's post-branch norms
      be->rmsnorm(PH, WH, PH, 1e-6f, (int)hd);  // QK-norm
      be->add_residual(X, D, &W, &o3, 1e-5f, 1.0f);
      be->add_residual(X, D, nullptr, nullptr, 1e-5f, 1.0f);
      be->add_residual(X, D, &W, &o4, 1e-5f, 0.22f);  // Granite's residual_scale
      be->add_residual(X, D, nullptr, nullptr, 1e-5f, -1.5f);
    });
    outs[i++] = {host(*be, o1), host(*be, o2), host(*be, o3), host(*be, X), host(*be, P), host(*be, PH), host(*be, o4)};
  }
  expect_near(outs[1][0], outs[0][0], 1e-6f, "rmsnorm");
  expect_near(outs[1][1], outs[0][1], 1e-6f, "per-head rmsnorm");
  expect_near(outs[1][2], outs[0][2], 1e-6f, "fused residual + norm");
  expect_near(outs[1][3], outs[0][3], 0.0f, "residual four times, two of them scaled");
  expect_near(outs[1][4], outs[0][4], 1e-6f, "rmsnorm in place");
  expect_near(outs[1][5], outs[0][5], 1e-6f, "per-head rmsnorm in place");
  expect_near(outs[1][6], outs[0][6], 1e-6f, "scaled residual + norm");
  // In place is the same as into another tensor.
  expect_near(outs[1][4], outs[1][0], 0.0f, "in place vs out of place");
}

void check_rope_and_gate(CudaBackend& g, const HeadShape h, int rope_dim, RopeStyle style, GateActivation act) {
  CpuBackend c = cpu_reference();
  ForwardBatch b(4096);
  const std::vector<int32_t> table = {0}, toks = {1, 2, 3};
  ASSERT_TRUE(b.add_sequence(toks, 3000, table, ForwardBatch::Logits::Last).ok());  // large angles
  std::vector<double> inv_freq(rope_dim / 2);
  for (int i = 0; i < rope_dim / 2; i++) inv_freq[(size_t)i] = std::pow(100000.0, -2.0 * i / rope_dim);
  const int64_t n = 3;
  const std::vector<float> q = randn(n * h.n_head * h.head_dim, 5), k = randn(n * h.n_kv_head * h.head_dim, 6);
  const std::vector<float> gate = randn(n * 1536, 7, 3.0f), up = randn(n * 1536, 8);
  std::vector<std::vector<float>> outs[2];
  int i = 0;
  for (Backend* be : {(Backend*)&c, (Backend*)&g}) {
    Tensor Q = be->upload(q, n, h.n_head * h.head_dim), K = be->upload(k, n, h.n_kv_head * h.head_dim);
    Tensor A = be->new_tensor(n, rope_dim), G = be->upload(gate, n, 1536), U = be->upload(up, n, 1536);
    be->run_pass(100, [&] {  // a direct pass
      be->rope_angles(b, inv_freq, rope_dim, A);
      be->rope(Q, K, A, h, rope_dim, style);
      be->gated_activation(G, U, act);
    });
    outs[i++] = {host(*be, A), host(*be, Q), host(*be, K), host(*be, G)};
  }
  expect_near(outs[1][0], outs[0][0], 1e-7f, "rope angles");
  expect_near(outs[1][1], outs[0][1], 1e-6f, "rope q");
  expect_near(outs[1][2], outs[0][2], 1e-6f, "rope k");
  // The dims past rope_dim are left as they were.
  if (rope_dim < h.head_dim) {
    for (int hh = 0; hh < h.n_head; hh++)
      for (int d = rope_dim; d < h.head_dim; d++) {
        EXPECT_EQ(outs[1][1][(size_t)(hh * h.head_dim + d)], q[(size_t)(hh * h.head_dim + d)]);
      }
  }
  expect_near(outs[1][3], outs[0][3], 1e-5f, act == GateActivation::Silu ? "swiglu" : "geglu (gelu tanh)");
  // A rotation keeps each pair's length; NeoX and adjacent pairs rotate different pairs.
  if (style == RopeStyle::NeoxHalves) {
    const int half = rope_dim / 2;
    for (int d = 0; d < half; d++) {
      const float a = q[(size_t)d], b = q[(size_t)(d + half)], ra = outs[1][1][(size_t)d], rb = outs[1][1][(size_t)(d + half)];
      EXPECT_NEAR(ra * ra + rb * rb, a * a + b * b, 1e-4f * (1 + a * a + b * b)) << "neox pair " << d;
    }
  }
}

TEST(CudaBackend, RopeAnglesRopeAndSwigluMatchCpu) {
  NEED_GPU(g);
  check_rope_and_gate(g, HeadShape{9, 3, 64}, 64, RopeStyle::AdjacentPairs, GateActivation::Silu);
}

TEST(CudaBackend, NeoxRopeAndGeluGateMatchCpu) {
  NEED_GPU(g);
  {
    SCOPED_TRACE("Gemma 3 shape: NeoX halves over head_dim 256, GELU-tanh gate");
    check_rope_and_gate(g, HeadShape{4, 1, 256}, 256, RopeStyle::NeoxHalves, GateActivation::GeluTanh);
  }
  {
    SCOPED_TRACE("Qwen shape: NeoX halves, head_dim 64, SiLU gate");
    check_rope_and_gate(g, HeadShape{14, 2, 64}, 64, RopeStyle::NeoxHalves, GateActivation::Silu);
  }
  {
    SCOPED_TRACE("partial rotary: NeoX over 32 of 96 dims");
    check_rope_and_gate(g, HeadShape{6, 2, 96}, 32, RopeStyle::NeoxHalves, GateActivation::GeluTanh);
  }
  {
    SCOPED_TRACE("partial rotary: adjacent pairs over 32 of 64 dims");
    check_rope_and_gate(g, HeadShape{4, 4, 64}, 32, RopeStyle::AdjacentPairs, GateActivation::Silu);
  }
}

TEST(CudaBackend, MatmulGroupsWithBiasAndEmbedMatchCpu) {
  NEED_GPU(g);
  CpuBackend c = cpu_reference();
  const int64_t rows = 96, cols = 128, n = 5;
  const std::vector<float> w = randn(rows * cols, 9, 0.1f), w2 = randn(rows * cols, 10, 0.1f);
  const std::vector<float> x = randn(n * cols, 11), bias = randn(rows, 12);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); i++) w16[i] = fp32_to_fp16(w[i]);
  ForwardBatch b(64);
  const std::vector<int32_t> table = {0}, toks = {3, 0, 95, 17};
  ASSERT_TRUE(b.add_sequence(toks, 0, table, ForwardBatch::Logits::Last).ok());
  std::vector<std::vector<float>> outs[2];
  int i = 0;
  for (Backend* be : {(Backend*)&c, (Backend*)&g}) {
    auto W = be->prepare_weight({"w", DType::F32, (const uint8_t*)w.data(), rows, cols, (size_t)cols * 4}, true);
    auto W2 = be->prepare_weight({"w2", DType::F32, (const uint8_t*)w2.data(), rows, cols, (size_t)cols * 4}, true);
    auto E = be->prepare_weight({"e", DType::F16, (const uint8_t*)w16.data(), rows, cols, (size_t)cols * 2}, false);
    ASSERT_TRUE(W.ok() && W2.ok() && E.ok());
    Tensor X = be->upload(x, n, cols), B = be->upload(bias, 1, rows);
    Tensor o1 = be->new_tensor(n, rows), o2 = be->new_tensor(n, rows), emb = be->new_tensor(4, cols);
    Tensor scaled = be->new_tensor(4, cols), scaled_graph = be->new_tensor(4, cols);
    const Product group[2] = {{&W.value(), &o1, &B}, {&W2.value(), &o2, nullptr}};
    be->run_pass(n, [&] {
      be->matmul(group, X);
      be->embed(E.value(), b, emb, 1.0f);
      be->embed(E.value(), b, scaled, std::sqrt(640.0f));  // Gemma 3 270M's sqrt(n_embd)
    });
    be->run_pass(1, [&] { be->embed(E.value(), b, scaled_graph, 12.0f); });  // Granite's, in a graph
    outs[i++] = {host(*be, o1), host(*be, o2), host(*be, emb), host(*be, scaled), host(*be, scaled_graph)};
  }
  expect_near(outs[1][0], outs[0][0], 1e-4f, "product + bias");
  expect_near(outs[1][1], outs[0][1], 1e-4f, "second product of the group");
  expect_near(outs[1][2], outs[0][2], 0.0f, "f16 embedding rows");
  expect_near(outs[1][3], outs[0][3], 0.0f, "scaled f16 embedding rows");
  expect_near(outs[1][4], outs[0][4], 0.0f, "scaled f16 embedding rows (graph)");
  EXPECT_NE(outs[1][3][0], outs[1][2][0]) << "the scale was applied";
}

// ---- K,V store and attention ----

// GGML's quantize_row_q8_0_ref for one row, and its dequantization.
std::vector<uint8_t> q8_0_bytes(const float* x, int64_t n) {
  std::vector<uint8_t> out((size_t)(n / 32 * 34));
  for (int64_t b = 0; b < n / 32; b++) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = fp32_to_fp16(d);
    std::memcpy(&out[(size_t)b * 34], &h, 2);
    for (int j = 0; j < 32; j++) out[(size_t)b * 34 + 2 + j] = (uint8_t)(int8_t)std::round(x[b * 32 + j] * id);
  }
  return out;
}
std::vector<float> q8_0_round_trip(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  const std::vector<uint8_t> q = q8_0_bytes(x.data(), (int64_t)x.size());
  for (size_t b = 0; b < x.size() / 32; b++) {
    uint16_t h;
    std::memcpy(&h, &q[b * 34], 2);
    for (int j = 0; j < 32; j++) out[b * 32 + j] = fp16_to_fp32(h) * (float)(int8_t)q[b * 34 + 2 + j];
  }
  return out;
}

// The store's bytes, copied on the backend's stream: it is non-blocking, so a copy on the
// legacy default stream would not wait for the kernels that wrote them.
std::vector<uint8_t> download(CudaBackend& be, const KvStore& kv) {
  std::vector<uint8_t> h(kv.bytes());
  EXPECT_EQ(cudaMemcpyAsync(h.data(), kv.data, h.size(), cudaMemcpyDeviceToHost, be.stream()), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(be.stream()), cudaSuccess);
  return h;
}

TEST(CudaBackend, StoreKvWritesTheCpuBytesForEveryDtype) {
  NEED_GPU(g);
  CpuBackend c = cpu_reference();
  const int n_kv = 2, hd = 64, bt = 16, layers = 2;
  const int64_t n = 6;
  const std::vector<float> k = randn(n * n_kv * hd, 13), v = randn(n * n_kv * hd, 14);
  ForwardBatch b(bt);
  const std::vector<int32_t> table = {3, 1};
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>(n, 1), 12, table, ForwardBatch::Logits::None).ok());  // crosses a block
  for (DType dt : {DType::F32, DType::F16, DType::Q8_0}) {
    const size_t rb = kv_row_bytes(dt, n_kv, hd).value();
    auto gkv = g.new_kv_store(dt, layers, bt, 4, rb);
    ASSERT_TRUE(gkv.ok()) << gkv.error().message;
    ASSERT_EQ(cudaMemsetAsync(gkv->data, 0, gkv->bytes(), g.stream()), cudaSuccess);  // in order with the pass
    Tensor K = g.upload(k, n, n_kv * hd), V = g.upload(v, n, n_kv * hd);
    g.run_pass(n, [&] { g.store_kv(K, V, gkv.value(), 1, b); });
    const std::vector<uint8_t> got = download(g, gkv.value());
    ASSERT_TRUE(g.error().ok()) << g.error().error().message;
    // The expected bytes: the CPU's store (f32, f16) or GGML's q8_0 rows, at the same slots.
    std::vector<uint8_t> want(got.size(), 0);
    if (dt == DType::Q8_0) {
      for (int64_t t = 0; t < n; t++) {
        const int64_t slot = b.slots()[(size_t)t];
        uint8_t* row = want.data() + b.slot_block(slot) * gkv->block_bytes() + b.slot_row(slot) * rb;
        const auto kq = q8_0_bytes(k.data() + t * n_kv * hd, n_kv * hd), vq = q8_0_bytes(v.data() + t * n_kv * hd, n_kv * hd);
        std::memcpy(row + gkv->k_offset(1), kq.data(), rb);
        std::memcpy(row + gkv->v_offset(1), vq.data(), rb);
      }
    } else {
      auto ckv = c.new_kv_store(dt, layers, bt, 4, rb);
      ASSERT_TRUE(ckv.ok());
      std::memset(ckv->data, 0, ckv->bytes());
      Tensor CK = c.upload(k, n, n_kv * hd), CV = c.upload(v, n, n_kv * hd);
      c.run_pass(n, [&] { c.store_kv(CK, CV, ckv.value(), 1, b); });
      std::memcpy(want.data(), ckv->data, want.size());
    }
    EXPECT_TRUE(got == want) << dtype_name(dt) << " K,V bytes differ";
  }
}

TEST(CudaBackend, QuantizedEmbeddingScaledMatchesCpu) {
  NEED_GPU(g);
  CpuBackend c = cpu_reference();
  const int64_t rows = 64, cols = 256;
  const std::vector<float> w = randn(rows * cols, 18);
  const std::vector<uint8_t> q8 = q8_0_bytes(w.data(), rows * cols);
  ForwardBatch b(64);
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{9, 0, 63}, 0, std::vector<int32_t>{0}, ForwardBatch::Logits::Last).ok());
  std::vector<float> outs[2];
  int i = 0;
  for (Backend* be : {(Backend*)&c, (Backend*)&g}) {
    auto E = be->prepare_weight({"e", DType::Q8_0, q8.data(), rows, cols, (size_t)cols / 32 * 34}, false);
    ASSERT_TRUE(E.ok()) << E.error().message;
    Tensor emb = be->new_tensor(3, cols);
    be->run_pass(3, [&] { be->embed(E.value(), b, emb, 25.298221f); });
    outs[i++] = host(*be, emb);
  }
  expect_near(outs[1], outs[0], 0.0f, "scaled q8_0 embedding rows");
}

struct AttnCase {
  const char* name;
  HeadShape h;
  DType dtype;
  std::vector<std::pair<int64_t, int64_t>> queries;  // per sequence: first position, count
  AttentionParams p = {};                            // scale 0: 1 / sqrt(head_dim)
};

// Fills every sequence's cache up to its last query position on both backends (the GPU's in
// cfg.dtype; the CPU's in f32 holding what that dtype rounds to), then attends.
void check_attention(CudaBackend& g, const AttnCase& cfg) {
  CpuBackend c = cpu_reference();
  const HeadShape h = cfg.h;
  const int bt = 16, kvw = h.n_kv_head * h.head_dim, qw = h.n_head * h.head_dim;
  const int n_seq = (int)cfg.queries.size();
  // Shuffled blocks: sequence s owns blocks perm[s * per .. (s+1) * per).
  int64_t max_ctx = 0;
  for (auto [p, n] : cfg.queries) max_ctx = std::max(max_ctx, p + n);
  const int per = (int)((max_ctx + bt - 1) / bt);
  std::vector<int32_t> perm((size_t)(per * n_seq));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(99));
  std::vector<std::vector<int32_t>> tables((size_t)n_seq);
  for (int s = 0; s < n_seq; s++) tables[(size_t)s].assign(perm.begin() + s * per, perm.begin() + (s + 1) * per);

  const DType cpu_dtype = cfg.dtype == DType::Q8_0 ? DType::F32 : cfg.dtype;
  auto gkv = g.new_kv_store(cfg.dtype, 1, bt, (int64_t)perm.size(), kv_row_bytes(cfg.dtype, h.n_kv_head, h.head_dim).value());
  auto ckv = c.new_kv_store(cpu_dtype, 1, bt, (int64_t)perm.size(), kv_row_bytes(cpu_dtype, h.n_kv_head, h.head_dim).value());
  ASSERT_TRUE(gkv.ok() && ckv.ok());

  // History: every position of every sequence up to its last query, in one batch.
  ForwardBatch hist(bt);
  for (int s = 0; s < n_seq; s++) {
    const int64_t len = cfg.queries[(size_t)s].first + cfg.queries[(size_t)s].second;
    ASSERT_TRUE(hist.add_sequence(std::vector<int32_t>((size_t)len, 0), 0, tables[(size_t)s], ForwardBatch::Logits::None).ok());
  }
  const int64_t nh = hist.n_tokens();
  const std::vector<float> k = randn(nh * kvw, 21), v = randn(nh * kvw, 22);
  const std::vector<float> kc = cfg.dtype == DType::Q8_0 ? q8_0_round_trip(k) : k;
  const std::vector<float> vc = cfg.dtype == DType::Q8_0 ? q8_0_round_trip(v) : v;
  {
    Tensor K = g.upload(k, nh, kvw), V = g.upload(v, nh, kvw);
    g.run_pass(nh, [&] { g.store_kv(K, V, gkv.value(), 0, hist); });
    Tensor CK = c.upload(kc, nh, kvw), CV = c.upload(vc, nh, kvw);
    c.run_pass(nh, [&] { c.store_kv(CK, CV, ckv.value(), 0, hist); });
  }
  // The queries.
  ForwardBatch qb(bt);
  for (int s = 0; s < n_seq; s++) {
    const auto [p, n] = cfg.queries[(size_t)s];
    ASSERT_TRUE(qb.add_sequence(std::vector<int32_t>((size_t)n, 0), p, tables[(size_t)s], ForwardBatch::Logits::Last).ok());
  }
  const int64_t nq = qb.n_tokens();
  const std::vector<float> q = randn(nq * qw, 23);
  Tensor GQ = g.upload(q, nq, qw), GO = g.new_tensor(nq, qw);
  Tensor CQ = c.upload(q, nq, qw), CO = c.new_tensor(nq, qw);
  const AttentionParams ap{cfg.p.scale != 0.0f ? cfg.p.scale : 1.0f / std::sqrt((float)h.head_dim), cfg.p.window};
  g.run_pass(nq, [&] { g.attention(GQ, gkv.value(), 0, qb, h, ap, GO); });
  c.run_pass(nq, [&] { c.attention(CQ, ckv.value(), 0, qb, h, ap, CO); });
  ASSERT_TRUE(g.error().ok()) << g.error().error().message;
  expect_near(host(g, GO), host(c, CO), 2e-5f, cfg.name);
  if (cfg.p.window <= 0) return;
  // The window matters here: the same queries without it give other outputs.
  Tensor GW = g.new_tensor(nq, qw);
  g.run_pass(nq, [&] { g.attention(GQ, gkv.value(), 0, qb, h, AttentionParams{ap.scale, 0}, GW); });
  const std::vector<float> windowed = host(g, GO), full = host(g, GW);
  float most = 0;
  for (size_t i = 0; i < full.size(); i++) most = std::max(most, std::fabs(full[i] - windowed[i]));
  EXPECT_GT(most, 1e-3f) << cfg.name << ": the window changed nothing";
}

TEST(CudaBackend, AttentionMatchesCpuOverPagedBlocks) {
  NEED_GPU(g);
  const HeadShape smol{9, 3, 64}, llama{32, 8, 128}, mha{4, 4, 64};
  for (DType dt : {DType::F32, DType::F16, DType::Q8_0}) {
    const std::vector<AttnCase> cases = {
        {"decode, one sequence, split-K", smol, dt, {{700, 1}}},
        {"decode, batch of 3 (GQA 4, head_dim 128)", llama, dt, {{300, 1}, {0, 1}, {77, 1}}},
        {"decode, two tokens of one sequence", mha, dt, {{40, 2}}},
        {"prefill chunk after a prefix", smol, dt, {{20, 45}}},
        {"prefill from zero, head_dim 128", llama, dt, {{0, 33}}},
        {"mixed: a prefill chunk and decode tokens", smol, dt, {{5, 1}, {10, 20}, {260, 1}}},
    };
    for (const AttnCase& a : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ": " + a.name);
      check_attention(g, a);
    }
  }
}

// Gemma 3's shapes (head_dim 256, one KV head, 512-key windows on local layers), Phi-3's
// head_dim 96, a score scale that is not 1 / sqrt(head_dim) (Granite, Gemma 3 27B), and
// windows that cut through decode slices, prefill tiles and a mixed batch.
TEST(CudaBackend, AttentionWithScaleWindowAndWideHeadsMatchesCpu) {
  NEED_GPU(g);
  const HeadShape gemma{4, 1, 256}, phi{8, 8, 96}, smol{9, 3, 64};
  for (DType dt : {DType::F32, DType::F16, DType::Q8_0}) {
    const std::vector<AttnCase> cases = {
        {"head_dim 256: decode, split-K", gemma, dt, {{900, 1}}},
        {"head_dim 256: prefill chunk", gemma, dt, {{40, 37}}},
        {"head_dim 256: decode inside a 512-key window", gemma, dt, {{1300, 1}}, {0, 512}},
        {"head_dim 256: prefill across a window's edge", gemma, dt, {{500, 40}}, {0, 512}},
        {"head_dim 96: decode and prefill", phi, dt, {{300, 1}, {7, 20}}},
        {"scale 1/8 on head_dim 64 (Granite-like)", smol, dt, {{130, 1}, {0, 19}}, {0.125f, 0}},
        {"small window: decode, split-K slices partly outside it", smol, dt, {{700, 1}}, {0, 100}},
        {"small window: prefill tile whose rows see different keys", smol, dt, {{30, 45}}, {0, 7}},
        {"window and scale: mixed batch", smol, dt, {{5, 1}, {60, 20}, {260, 1}}, {0.3f, 33}},
        {"window of 1: each query sees itself", smol, dt, {{12, 5}, {90, 1}}, {0, 1}},
    };
    for (const AttnCase& a : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ": " + a.name);
      check_attention(g, a);
    }
  }
}

// A decode graph replays only for the same parameters: a pass that differs in the attention
// window or scale, the RoPE style, the gate, or a scale of the embedding, the residual or the
// logits captures its own graph, and each gives what a direct pass gives.
TEST(CudaBackend, GraphSignatureIncludesEveryParameter) {
  auto made = CudaBackend::create();
  if (!made.ok()) GTEST_SKIP() << "no GPU here: " << made.error().message;
  CudaBackendOptions no_graphs;
  no_graphs.graphs = false;
  auto direct_made = CudaBackend::create(no_graphs);
  ASSERT_TRUE(direct_made.ok());
  CudaBackend& g = *made.value();
  CudaBackend& d = *direct_made.value();
  const HeadShape h{4, 2, 64};
  const int bt = 16, qw = 4 * 64, kvw = 2 * 64, vocab = 100, rope_dim = 64;
  const std::vector<int32_t> table = {3, 1, 2, 0};
  const std::vector<float> w = randn(vocab * qw, 40, 0.2f), wn = randn(qw, 41);
  std::vector<double> inv_freq(rope_dim / 2);
  for (int i = 0; i < rope_dim / 2; i++) inv_freq[(size_t)i] = std::pow(10000.0, -2.0 * i / rope_dim);
  struct Variant {
    const char* name;
    AttentionParams ap;
    RopeStyle rope;
    GateActivation act;
    float embed, residual;
    LogitsParams lp;
  };
  const std::vector<Variant> variants = {
      {"base", {0.125f, 0}, RopeStyle::AdjacentPairs, GateActivation::Silu, 1.0f, 1.0f, {}},
      {"window", {0.125f, 9}, RopeStyle::AdjacentPairs, GateActivation::Silu, 1.0f, 1.0f, {}},
      {"scale", {0.3f, 0}, RopeStyle::AdjacentPairs, GateActivation::Silu, 1.0f, 1.0f, {}},
      {"neox", {0.125f, 0}, RopeStyle::NeoxHalves, GateActivation::Silu, 1.0f, 1.0f, {}},
      {"gelu", {0.125f, 0}, RopeStyle::AdjacentPairs, GateActivation::GeluTanh, 1.0f, 1.0f, {}},
      {"embed scale", {0.125f, 0}, RopeStyle::AdjacentPairs, GateActivation::Silu, 3.0f, 1.0f, {}},
      {"residual scale", {0.125f, 0}, RopeStyle::AdjacentPairs, GateActivation::Silu, 1.0f, 0.5f, {}},
      {"logit scale", {0.125f, 0}, RopeStyle::AdjacentPairs, GateActivation::Silu, 1.0f, 1.0f, {0.25f, 0}},
      {"logit softcap", {0.125f, 0}, RopeStyle::AdjacentPairs, GateActivation::Silu, 1.0f, 1.0f, {1.0f, 2.0f}},
  };
  std::vector<std::vector<float>> outs[2];
  int which = 0;
  for (CudaBackend* be : {&g, &d}) {
    auto kv = be->new_kv_store(DType::F16, 1, bt, 4, kv_row_bytes(DType::F16, 2, 64).value());
    auto W = be->prepare_weight({"out", DType::F32, (const uint8_t*)w.data(), vocab, qw, (size_t)qw * 4}, true);
    auto E = be->prepare_weight({"e", DType::F32, (const uint8_t*)w.data(), vocab, qw, (size_t)qw * 4}, false);
    ASSERT_TRUE(kv.ok() && W.ok() && E.ok());
    Tensor X = be->new_tensor(1, qw), Q = be->new_tensor(1, qw), K = be->new_tensor(1, kvw), V = be->new_tensor(1, kvw),
           O = be->new_tensor(1, qw), A = be->new_tensor(1, rope_dim), N = be->upload(wn, 1, qw),
           S = be->new_tensor(1, qw), L = be->new_tensor(1, vocab);
    const int64_t steps = 24;
    for (const Variant& v : variants) {
      to_device(*be, Q, std::vector<float>(qw, 0.0f));  // each variant from the same start
      for (int64_t pos = 0; pos < steps; pos++) {  // the cache is rewritten by each variant
        ForwardBatch b(bt);
        ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{(int32_t)(pos * 7 % vocab)}, pos, table, ForwardBatch::Logits::Last).ok());
        const std::vector<float> k = randn(kvw, 200 + (uint32_t)pos), val = randn(kvw, 300 + (uint32_t)pos);
        to_device(*be, K, k);
        to_device(*be, V, val);
        be->run_pass(1, [&] {
          be->embed(E.value(), b, X, v.embed);
          be->rope_angles(b, inv_freq, rope_dim, A);
          be->add_residual(Q, X, nullptr, nullptr, 1e-5f, v.residual);  // Q accumulates the embeddings
          be->rope(Q, K, A, h, rope_dim, v.rope);
          be->store_kv(K, V, kv.value(), 0, b);
          be->attention(Q, kv.value(), 0, b, h, v.ap, O);
          be->gated_activation(O, X, v.act);
          be->logits(O, std::vector<int64_t>{0}, N, 1e-5f, W.value(), S, L, v.lp);
        });
      }
      outs[which].push_back(host(*be, L));
      outs[which].push_back(host(*be, Q));
    }
    which++;
  }
  ASSERT_TRUE(g.error().ok()) << g.error().error().message;
  ASSERT_TRUE(d.error().ok()) << d.error().error().message;
  EXPECT_EQ(g.graphs_captured(), (int64_t)variants.size()) << "each variant captures one graph and replays it";
  for (size_t i = 0; i < outs[0].size(); i++) {
    SCOPED_TRACE(variants[i / 2].name);
    expect_near(outs[0][i], outs[1][i], 0.0f, "graph vs direct");
  }
  // And every variant changed something: each parameter reached the kernels.
  for (size_t i = 1; i < variants.size(); i++) EXPECT_NE(outs[0][2 * i], outs[0][0]) << variants[i].name;
}

TEST(CudaBackend, DecodeGraphReplaysAcrossStepsAndEqualsDirectPasses) {
  auto made = CudaBackend::create();
  if (!made.ok()) GTEST_SKIP() << "no GPU here: " << made.error().message;
  CudaBackendOptions no_graphs;
  no_graphs.graphs = false;
  auto direct_made = CudaBackend::create(no_graphs);
  ASSERT_TRUE(direct_made.ok());
  CudaBackend& g = *made.value();
  CudaBackend& d = *direct_made.value();
  const HeadShape h{8, 2, 64};
  const int bt = 16, qw = 8 * 64, kvw = 2 * 64;
  const std::vector<int32_t> table = {5, 0, 3, 1, 7, 2, 6, 4};
  std::vector<std::vector<float>> outs[2];
  int which = 0;
  for (CudaBackend* be : {&g, &d}) {
    auto kv = be->new_kv_store(DType::F16, 1, bt, 8, kv_row_bytes(DType::F16, 2, 64).value());
    ASSERT_TRUE(kv.ok());
    Tensor Q = be->new_tensor(1, qw), K = be->new_tensor(1, kvw), V = be->new_tensor(1, kvw), O = be->new_tensor(1, qw);
    for (int64_t pos = 0; pos < 40; pos++) {  // 40 decode steps, one graph shape
      ForwardBatch b(bt);
      ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{1}, pos, table, ForwardBatch::Logits::Last).ok());
      const std::vector<float> q = randn(qw, 100 + (uint32_t)pos), k = randn(kvw, 200 + (uint32_t)pos),
                               v = randn(kvw, 300 + (uint32_t)pos);
      to_device(*be, Q, q);
      to_device(*be, K, k);
      to_device(*be, V, v);
      be->run_pass(1, [&] {
        be->store_kv(K, V, kv.value(), 0, b);
        be->attention(Q, kv.value(), 0, b, h, AttentionParams{0.125f, 0}, O);
      });
      outs[which].push_back(host(*be, O));
      if (be == &g && pos > 0) {
        EXPECT_TRUE(g.last_pass().graph);
        EXPECT_FALSE(g.last_pass().captured) << "step " << pos << " captured a new graph";
      }
    }
    which++;
  }
  EXPECT_EQ(g.graphs_captured(), 1);
  EXPECT_GE(g.last_pass().kernels, 2);
  for (size_t s = 0; s < outs[0].size(); s++) expect_near(outs[0][s], outs[1][s], 0.0f, "graph vs direct");
  ASSERT_TRUE(g.error().ok()) << g.error().error().message;
}

TEST(CudaBackend, LogitsOfChosenRowsMatchCpu) {
  NEED_GPU(g);
  CpuBackend c = cpu_reference();
  const int64_t n = 6, d = 64, vocab = 200;
  const std::vector<float> x = randn(n * d, 31), norm = randn(d, 32), w = randn(vocab * d, 33, 0.2f);
  const std::vector<int64_t> rows = {5, 1, 3};
  const LogitsParams granite{1.0f / 8.0f, 0.0f}, gemma{1.0f, 3.0f}, both{2.0f, 5.0f};
  std::vector<float> outs[2][4];
  int i = 0;
  for (Backend* be : {(Backend*)&c, (Backend*)&g}) {
    auto W = be->prepare_weight({"out", DType::F32, (const uint8_t*)w.data(), vocab, d, (size_t)d * 4}, true);
    ASSERT_TRUE(W.ok());
    Tensor X = be->upload(x, n, d), N = be->upload(norm, 1, d), S = be->new_tensor(n, d), O = be->new_tensor(3, vocab);
    be->run_pass(1, [&] { be->logits(X, rows, N, 1e-5f, W.value(), S, O, LogitsParams{}); });  // as a graph
    be->run_pass(1, [&] { be->logits(X, rows, N, 1e-5f, W.value(), S, O, LogitsParams{}); });  // replayed
    outs[i][0] = host(*be, O);
    int j = 1;
    for (const LogitsParams& lp : {granite, gemma, both}) {
      be->run_pass(1, [&] { be->logits(X, rows, N, 1e-5f, W.value(), S, O, lp); });
      be->run_pass(1, [&] { be->logits(X, rows, N, 1e-5f, W.value(), S, O, lp); });
      outs[i][j++] = host(*be, O);
    }
    i++;
  }
  expect_near(outs[1][0], outs[0][0], 1e-4f, "logits");
  expect_near(outs[1][1], outs[0][1], 1e-4f, "logits scaled");
  expect_near(outs[1][2], outs[0][2], 1e-4f, "logits soft-capped");
  expect_near(outs[1][3], outs[0][3], 1e-4f, "logits scaled and soft-capped");
  float most = 0;
  for (float v : outs[1][2]) most = std::max(most, std::fabs(v));
  EXPECT_LE(most, 3.0f) << "the soft-cap bounds the logits";
  EXPECT_GT(most, 1.0f) << "the logits reach into the cap's curve";
}

// A weight freed and another prepared in its place (its host object, even its device memory,
// may land at the same address) must not replay the old weight's graph.
TEST(CudaBackend, ANewWeightAtAnOldAddressCapturesItsOwnGraph) {
  NEED_GPU(g);
  CpuBackend c = cpu_reference();
  const int64_t d = 64, vocab = 96;
  const std::vector<float> x = randn(d, 41), norm = randn(d, 42);
  const std::vector<int64_t> rows = {0};
  Tensor X = g.upload(x, 1, d), N = g.upload(norm, 1, d), S = g.new_tensor(1, d), O = g.new_tensor(1, vocab);
  Tensor CX = c.upload(x, 1, d), CN = c.upload(norm, 1, d), CS = c.new_tensor(1, d), CO = c.new_tensor(1, vocab);
  for (uint32_t seed : {43u, 44u}) {
    const std::vector<float> w = randn(vocab * d, seed, 0.2f);
    const WeightSource src{"out", DType::F32, (const uint8_t*)w.data(), vocab, d, (size_t)d * 4};
    auto W = g.prepare_weight(src, true);
    auto CW = c.prepare_weight(src, true);
    ASSERT_TRUE(W.ok() && CW.ok());
    g.run_pass(1, [&] { g.logits(X, rows, N, 1e-5f, W.value(), S, O, LogitsParams{}); });
    c.run_pass(1, [&] { c.logits(CX, rows, CN, 1e-5f, CW.value(), CS, CO, LogitsParams{}); });
    EXPECT_TRUE(g.last_pass().captured) << "weight " << seed << " replayed another weight's graph";
    expect_near(host(g, O), host(c, CO), 1e-4f, "logits of the new weight");
  }  // the first weight is freed before the second is prepared
  EXPECT_EQ(g.graphs_captured(), 2);
  ASSERT_TRUE(g.error().ok()) << g.error().error().message;
}

TEST(CudaBackend, MemoryErrorsNameTheBytes) {
  NEED_GPU(g);
  auto kv = g.new_kv_store(DType::F16, 1000, 256, 1 << 20, 4096);  // ~2 PB
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.error().message.find("bytes"), std::string::npos) << kv.error().message;
  EXPECT_TRUE(g.error().ok()) << "an allocation that does not fit leaves the backend usable";
  // A KV store in host memory is refused, not dereferenced.
  CpuBackend c = cpu_reference();
  auto host_kv = c.new_kv_store(DType::F16, 1, 16, 1, kv_row_bytes(DType::F16, 1, 64).value());
  ASSERT_TRUE(host_kv.ok());
  ForwardBatch b(16);
  ASSERT_TRUE(b.add_sequence(std::vector<int32_t>{1}, 0, std::vector<int32_t>{0}, ForwardBatch::Logits::Last).ok());
  Tensor K = g.new_tensor(1, 64), V = g.new_tensor(1, 64);
  g.run_pass(1, [&] { g.store_kv(K, V, host_kv.value(), 0, b); });
  ASSERT_FALSE(g.error().ok());
  EXPECT_NE(g.error().error().message.find("not in GPU memory"), std::string::npos);
}

}  // namespace
}  // namespace tandem
