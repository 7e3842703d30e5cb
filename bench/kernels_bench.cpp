// Kernel micro-benchmarks (Google Benchmark), per ISA level this CPU runs. Not tests: run
//   build/bench/tandem_kernels_bench [--benchmark_filter=dot4]
// Bytes/s counts the weight bytes each kernel reads; items/s the multiply-adds.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/work_team.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/kernel_table.h"
#include "core/fp16.h"
#include "kernels/cpu/packed_float.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/probe.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/quant_dot.h"

namespace tandem::cpu {
namespace {

constexpr int64_t kCols = 2048;

std::vector<uint8_t> random_row(DType t, int64_t cols, std::mt19937& rng) {
  const auto info = *dtype_info((uint32_t)t);
  std::vector<uint8_t> row(cols / info.block_elems * info.block_bytes);
  for (auto& b : row) b = (uint8_t)rng();
  if (t == DType::MXFP4) {  // E8M0 scale bytes: 2^-8
    for (size_t at = 0; at < row.size(); at += info.block_bytes) row[at] = 120;
    return row;
  }
  // Keep fp16 scales small and finite: a block's scale is its first two bytes (Q6_K: last two).
  const size_t d_at = t == DType::Q6_K ? info.block_bytes - 2 : 0;
  for (size_t at = d_at; at + 1 < row.size(); at += info.block_bytes) row[at] = 0x00, row[at + 1] = 0x20;
  if (t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K)  // offset or min scale
    for (size_t at = 2; at + 1 < row.size(); at += info.block_bytes) row[at] = 0x00, row[at + 1] = 0x20;
  return row;
}

void BM_QuantDot(benchmark::State& st, DType t, Isa isa) {
  std::mt19937 rng(1);
  const auto row = random_row(t, kCols, rng);
  std::vector<float> x(kCols);
  for (auto& v : x) v = (float)(rng() % 200) / 100.0f - 1.0f;
  std::vector<BlockQ8Act> xq(kCols / 32);
  kernels_for(isa).quantize_act(x.data(), xq.data(), kCols);
  const QuantDotFn f = kernels_for(isa).quant_dot(t);
  for (auto _ : st) benchmark::DoNotOptimize(f(row.data(), xq.data(), kCols));
  st.SetBytesProcessed(st.iterations() * (int64_t)row.size());
  st.SetItemsProcessed(st.iterations() * kCols);
}

void BM_QuantDot4(benchmark::State& st, DType t, Isa isa) {
  std::mt19937 rng(2);
  const auto row = random_row(t, kCols, rng);
  std::vector<float> x(4 * kCols);
  for (auto& v : x) v = (float)(rng() % 200) / 100.0f - 1.0f;
  std::vector<BlockQ8Act> xq(4 * kCols / 32);
  for (int j = 0; j < 4; j++) kernels_for(isa).quantize_act(x.data() + j * kCols, xq.data() + j * kCols / 32, kCols);
  const QuantDot4Fn f = kernels_for(isa).quant_dot4(t);
  float out[4];
  for (auto _ : st) {
    f(row.data(), xq.data(), kCols / 32, kCols, out);
    benchmark::DoNotOptimize(out);
  }
  st.SetItemsProcessed(st.iterations() * 4 * kCols);
}

// One packed 16-row group x 8 tokens (the prefill kernel) or x 1 token (decode).
void BM_PackedGemm(benchmark::State& st, DType t, Isa isa, int tokens) {
  std::mt19937 rng(4);
  std::vector<uint8_t> rows;
  for (int r = 0; r < kPackRows; r++) {
    const auto row = random_row(t, kCols, rng);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  const auto packed = pack_rows(t, rows.data(), kPackRows, kCols, rows.size() / kPackRows);
  std::vector<float> x(tokens * kCols);
  for (auto& v : x) v = (float)(rng() % 200) / 100.0f - 1.0f;
  std::vector<BlockQ8Act> xq(tokens * kCols / 32);
  kernels_for(isa).quantize_act(x.data(), xq.data(), tokens * kCols);
  const PackedGemmFn f = kernels_for(isa).packed(t);
  std::vector<float> out(tokens * kPackRows);
  for (auto _ : st) {
    f(packed.get(), kCols, xq.data(), kCols / 32, tokens, out.data(), kPackRows, kPackRows);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * kPackRows * tokens * kCols);  // multiply-adds
  st.SetBytesProcessed(st.iterations() * (int64_t)rows.size());
}

// One packed F16 group of 16 rows x 128 tokens (a prefill chunk, one call), x 8, or x 1 token
// (decode), float activations; st.range(0) columns.
void BM_PackedFloatGemm(benchmark::State& st, Isa isa, int tokens) {
  const int64_t C = st.range(0);
  std::mt19937 rng(6);
  std::vector<uint16_t> rows(kPackRows * C);
  for (auto& v : rows) v = fp32_to_fp16((float)(rng() % 200) / 100.0f - 1.0f);
  const auto packed = pack_float_rows(DType::F16, reinterpret_cast<const uint8_t*>(rows.data()), kPackRows, C, C * 2);
  std::vector<float> x(tokens * C);
  for (auto& v : x) v = (float)(rng() % 200) / 100.0f - 1.0f;
  const PackedFloatGemmFn f = kernels_for(isa).packed_float(DType::F16);
  std::vector<float> out(tokens * kPackRows);
  for (auto _ : st) {
    f(packed.get(), C, x.data(), C, tokens, out.data(), kPackRows, kPackRows);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * kPackRows * tokens * C);  // multiply-adds
  st.SetBytesProcessed(st.iterations() * (int64_t)rows.size() * 2);
}

// Decode's stream from memory: a 16-row-group matrix far larger than the caches (192k x 2048,
// 216 MiB as Q4_0, 315 MiB as Q6_K) against one token, threads taking static halves, next to the bandwidth probe
// run over the same number of bytes: the kernel's share of what the machine can read. The
// second argument, tokens: 16 is a serving step of 16 streams through a large output head
// (each group against 8 tokens, then the next 8, as matmul's packed tiles call it).
void BM_PackedStream(benchmark::State& st, DType t, Isa isa) {
  const int threads = (int)st.range(0), tokens = (int)st.range(1);
  constexpr int64_t kRows = 8192 * 24;
  std::mt19937 rng(5);
  const auto row = random_row(t, kCols, rng);
  std::vector<uint8_t> rows(row.size() * kRows);
  for (int64_t r = 0; r < kRows; r++) std::copy(row.begin(), row.end(), rows.begin() + r * (int64_t)row.size());
  const auto packed = pack_rows(t, rows.data(), kRows, kCols, row.size());
  const size_t gb = packed_group_bytes(t, kCols);
  std::vector<float> x(kCols * tokens);
  for (auto& e : x) e = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  const int64_t nb = kCols / 32;
  std::vector<BlockQ8Act> xq(nb * tokens);
  for (int tok = 0; tok < tokens; tok++) kernels_for(isa).quantize_act(x.data() + tok * kCols, xq.data() + tok * nb, kCols);
  const PackedGemmFn f = kernels_for(isa).packed(t);
  std::vector<float> out(kRows * tokens);
  const int64_t groups = kRows / kPackRows;
  for (auto _ : st) {
#pragma omp parallel num_threads(threads)
    {
      const int id = omp_get_thread_num(), nt = omp_get_num_threads();
      for (int64_t g = groups * id / nt; g < groups * (id + 1) / nt; g++)
        for (int tok = 0; tok < tokens; tok += kPackMaxTokens)
          f(packed.get() + g * gb, kCols, xq.data() + tok * nb, nb, std::min(kPackMaxTokens, tokens - tok),
            out.data() + tok * kRows + g * kPackRows, kRows, kPackRows);
    }
    benchmark::DoNotOptimize(out.data());
  }
  st.SetBytesProcessed(st.iterations() * (int64_t)rows.size());
  st.SetItemsProcessed(st.iterations() * kRows * kCols * tokens);  // multiply-adds
  st.counters["probe_GB/s"] = measure_read_bandwidth(threads, rows.size(), 3).best / 1e9;
}

void BM_RowDot(benchmark::State& st, DType t, Isa isa) {
  std::mt19937 rng(3);
  const auto row = random_row(t, kCols, rng);
  std::vector<float> x(kCols, 0.5f);
  const RowDotFn f = kernels_for(isa).row_dot(t);
  for (auto _ : st) benchmark::DoNotOptimize(f(row.data(), x.data(), kCols));
  st.SetBytesProcessed(st.iterations() * (int64_t)row.size());
  st.SetItemsProcessed(st.iterations() * kCols);
}

// One Q8_0 row (SmolLM2's 576 columns: its exact output head) against `tokens` tokens with
// float activations, every sum decode's float (dot.h: RowDotTokensFn); items/s: multiply-adds.
void BM_RowDotTokens(benchmark::State& st, DType t, Isa isa, int tokens) {
  constexpr int64_t kHeadCols = 576;
  std::mt19937 rng(7);
  const auto row = random_row(t, kHeadCols, rng);
  std::vector<float> x(tokens * kHeadCols, 0.5f), out(tokens);
  const RowDotTokensFn f = kernels_for(isa).row_dot_tokens(t);
  for (auto _ : st) {
    f(row.data(), x.data(), kHeadCols, tokens, kHeadCols, out.data(), 1);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * tokens * kHeadCols);
}

void BM_F32Tile(benchmark::State& st, Isa isa) {
  std::vector<float> a(2 * kCols, 0.25f), b(4 * kCols, 0.5f);
  const F32TileFn f = kernels_for(isa).tile_f32;
  float out[8];
  for (auto _ : st) {
    f(a.data(), kCols, b.data(), kCols, kCols, out);
    benchmark::DoNotOptimize(out);
  }
  st.SetItemsProcessed(st.iterations() * 8 * kCols);
}

void BM_QuantizeAct(benchmark::State& st, Isa isa) {
  std::vector<float> x(kCols, 0.3f);
  std::vector<BlockQ8Act> xq(kCols / 32);
  const QuantizeActFn f = kernels_for(isa).quantize_act;
  for (auto _ : st) {
    f(x.data(), xq.data(), kCols);
    benchmark::DoNotOptimize(xq.data());
  }
  st.SetItemsProcessed(st.iterations() * kCols);
}

// One decode token's attention over ctx keys in each of n_layers layers of shape s: Llama-3.2-1B's
// (32 query heads, 8 KV heads of 64), Gemma 3 270M's (4 query heads, 1 KV head of 256) or
// Phi-3-mini's (32 heads of 96), the cache F16 or Q8_0 (the same values, ~0.1). One layer's
// cache stays in the last-level cache between iterations; 16 layers' (128 MiB of F16 at 4096
// keys, Llama's shape) stream from memory as a real decode step does. Bytes/s: the K and V
// bytes read.
void BM_AttentionDecode(benchmark::State& st, Isa isa, DType kv_type, int n_layers, AttentionShape s) {
  const int64_t ctx = st.range(0), n = ctx * s.n_kv_head * s.head_dim;
  std::vector<float> q(s.n_head * s.head_dim, 0.1f), out(q.size());
  std::vector<float> rows(n);
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> ud(0.05f, 0.15f);
  for (auto& e : rows) e = ud(rng);
  const size_t bytes = kv_type == DType::F16 ? (size_t)n * 2 : (size_t)n / kQK * sizeof(BlockQ8_0);
  std::vector<uint8_t> layer(bytes);
  if (kv_type == DType::F16) {
    f32_to_f16_scalar(rows.data(), reinterpret_cast<uint16_t*>(layer.data()), n);
  } else {
    quantize_q8_0_scalar(rows.data(), layer.data(), n);
  }
  std::vector<std::vector<uint8_t>> k(n_layers, layer), v(n_layers, layer);
  const CpuKernels kernels = kernels_for(isa);
  for (auto _ : st) {
    for (int l = 0; l < n_layers; l++)
      attention(q.data(), k[l].data(), v[l].data(), kv_type, 1, ctx - 1, s, out.data(), kernels);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetBytesProcessed(st.iterations() * n_layers * (int64_t)(2 * bytes));
}

// A prefill chunk's attention: 512 query rows at positions [ctx - 512, ctx) over one layer's
// cache of ctx keys (SmolLM2-135M's shape: 9 query heads, 3 KV heads of 64; or Llama-3.2-1B's).
// Items: attention's FLOPs (4 x heads x head_dim per key), so the rate is GFLOP/s against the
// f32 FMA roof. On a team of the given threads, in real time.
void BM_AttentionPrefill(benchmark::State& st, Isa isa, DType kv_type, AttentionShape s) {
  const int64_t ctx = st.range(0), n_q = 512, n = ctx * s.n_kv_head * s.head_dim;
  WorkTeam team((int)st.range(1));  // the second argument: threads
  TeamScope scope(&team);
  std::vector<float> q(n_q * s.n_head * s.head_dim), out(q.size()), rows(n);
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  for (auto* v : {&q, &rows})
    for (auto& e : *v) e = nd(rng);
  const size_t bytes = kv_type == DType::F16 ? (size_t)n * 2 : (size_t)n / kQK * sizeof(BlockQ8_0);
  std::vector<uint8_t> k(bytes), v(bytes);
  if (kv_type == DType::F16) {
    f32_to_f16_scalar(rows.data(), reinterpret_cast<uint16_t*>(k.data()), n);
  } else {
    quantize_q8_0_scalar(rows.data(), k.data(), n);
  }
  v = k;
  const CpuKernels kernels = kernels_for(isa);
  for (auto _ : st) {
    attention(q.data(), k.data(), v.data(), kv_type, n_q, ctx - n_q, s, out.data(), kernels);
    benchmark::DoNotOptimize(out.data());
  }
  double keys = 0;
  for (int64_t i = 0; i < n_q; i++) keys += (double)(ctx - n_q + i + 1);
  st.counters["GFLOP/s"] = benchmark::Counter(4.0 * s.n_head * s.head_dim * keys * (double)st.iterations() / 1e9,
                                              benchmark::Counter::kIsRate);
}

// Storing one token's K (or V) row of that layer (8 x 64 floats) into a Q8_0 cache.
void BM_QuantizeKvRow(benchmark::State& st, Isa isa) {
  std::vector<float> x(8 * 64);
  std::mt19937 rng(6);
  std::normal_distribution<float> nd;
  for (auto& e : x) e = nd(rng);
  std::vector<BlockQ8_0> out(x.size() / kQK);
  const QuantizeQ8_0Fn f = kernels_for(isa).quantize_q8_0;
  for (auto _ : st) {
    f(x.data(), out.data(), (int64_t)x.size());
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * (int64_t)x.size());
}

int register_all() {
  for (Isa isa : supported_isas()) {
    const std::string at = std::string("/") + std::string(isa_name(isa));
    for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                    DType::Q6_K, DType::MXFP4}) {
      const std::string name(dtype_name(t));
      benchmark::RegisterBenchmark(("quant_dot/" + name + at).c_str(), BM_QuantDot, t, isa);
      if (kernels_for(isa).quant_dot4(t)) benchmark::RegisterBenchmark(("quant_dot4/" + name + at).c_str(), BM_QuantDot4, t, isa);
      if (kernels_for(isa).packed(t)) {
        benchmark::RegisterBenchmark(("packed_16x8/" + name + at).c_str(), BM_PackedGemm, t, isa, 8);
        benchmark::RegisterBenchmark(("packed_16x1/" + name + at).c_str(), BM_PackedGemm, t, isa, 1);
        if (t == DType::Q4_0 || t == DType::Q6_K || t == DType::MXFP4)
          benchmark::RegisterBenchmark(("packed_stream/" + name + at).c_str(), BM_PackedStream, t, isa)
              ->Args({1, 1})->Args({2, 1})->Args({1, 16})->Args({2, 16})->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);
      }
    }
    for (DType t : {DType::F16, DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q6_K, DType::MXFP4})
      benchmark::RegisterBenchmark(("row_dot/" + std::string(dtype_name(t)) + at).c_str(), BM_RowDot, t, isa);
    if (kernels_for(isa).row_dot_tokens(DType::Q8_0))
      for (int tokens : {1, 2, 5, 8})
        benchmark::RegisterBenchmark(("row_dot_tokens/Q8_0/" + std::to_string(tokens) + at).c_str(), BM_RowDotTokens,
                                     DType::Q8_0, isa, tokens);
    if (kernels_for(isa).packed_float(DType::F16)) {
      for (int tokens : {128, 8, 1})  // the argument: columns (SmolLM2-135M's, Llama-3.2-1B's)
        benchmark::RegisterBenchmark(("packed_float_16x" + std::to_string(tokens) + "/F16" + at).c_str(), BM_PackedFloatGemm,
                                     isa, tokens)
            ->Arg(576)
            ->Arg(2048);
    }
    benchmark::RegisterBenchmark(("f32_tile_2x4" + at).c_str(), BM_F32Tile, isa);
    benchmark::RegisterBenchmark(("quantize_act" + at).c_str(), BM_QuantizeAct, isa);
    for (DType kv : {DType::F16, DType::Q8_0}) {
      const std::string name = "attention_decode/" + std::string(dtype_name(kv)) + at;
      const AttentionShape llama{32, 8, 64}, gemma3{4, 1, 256}, phi3{32, 32, 96};
      benchmark::RegisterBenchmark(name.c_str(), BM_AttentionDecode, isa, kv, 1, llama)->Arg(512)->Arg(4096);
      benchmark::RegisterBenchmark((name + "/16_layers").c_str(), BM_AttentionDecode, isa, kv, 16, llama)->Arg(4096);
      benchmark::RegisterBenchmark((name + "/gemma3_hd256").c_str(), BM_AttentionDecode, isa, kv, 1, gemma3)
          ->Arg(512)->Arg(4096);
      benchmark::RegisterBenchmark((name + "/phi3_hd96").c_str(), BM_AttentionDecode, isa, kv, 1, phi3)->Arg(512)->Arg(4096);
    }
    for (DType kv : {DType::F16, DType::Q8_0}) {
      const std::string name = "attention_prefill/" + std::string(dtype_name(kv)) + at;
      benchmark::RegisterBenchmark((name + "/smollm2").c_str(), BM_AttentionPrefill, isa, kv, AttentionShape{9, 3, 64})
          ->Args({4608, 1})->Args({4608, 2})->UseRealTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((name + "/llama1b").c_str(), BM_AttentionPrefill, isa, kv, AttentionShape{32, 8, 64})
          ->Args({4608, 1})->Args({4608, 2})->UseRealTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((name + "/gemma3_hd256").c_str(), BM_AttentionPrefill, isa, kv, AttentionShape{4, 1, 256})
          ->Args({4608, 2})->UseRealTime()->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(("quantize_kv_row/Q8_0" + at).c_str(), BM_QuantizeKvRow, isa);
  }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace tandem::cpu

BENCHMARK_MAIN();
