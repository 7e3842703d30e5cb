// The CUDA backend's matrix products (backend/cuda/cuda_matmul.h) against a float64 reference
// of the weights as kernels/cpu/dequantize.cpp decodes them.
//
// Two kinds of test: CudaMatmulHost runs on any machine of a CUDA build: the layout the upload
// writes, decoded by the very functions the kernels call, must give dequantize_row's values
// bit for bit, and the matrix-vector kernels' work units (their int8 dot products, run on the
// CPU with dp4a emulated) must meet the reference. CudaMatmulDevice runs the kernels themselves
// and skips, saying why, where there is no GPU.
//
// Tolerances, from how each path rounds (u = 2^-24, float's unit roundoff; gamma(k) = k u
// bounds the rounding of k float additions in any order):
// - Against the activations the kernels really multiplied (q8_1 from quantize_block_q8_1, the
//   host twin of the device's quantization): gamma(cols / 8 + 16) * sum (|w| + |o|) |x^|, o
//   the constant each block's sum subtracts (8 d for Q4_0, the min for Q4_1 and Q4_K,
//   32 d sc for Q6_K), whose cancellation the float arithmetic also rounds.
// - 8-bit activations against the exact input: round-to-nearest moves each x by at most half
//   its block's step d = amax / 127, so the product moves by at most
//   sum_blocks d / 2 * sum_block |w| (plus the float rounding above).
// - GEMM: cuBLAS reads the input as F16 (BF16 for BF16 weights) and a quantized weight as F16:
//   each rounding moves a value by at most 2^-11 (BF16: 2^-8) of itself, or 2^-25 when F16 is
//   subnormal; accumulation in F32 adds gamma(cols).
#include <gtest/gtest.h>

#if TANDEM_HAS_CUDA

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cublas_api.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_matmul.h"
#include "backend/cuda/cuda_matmul_internal.cuh"
#include "backend/cuda/cuda_matmul_prepared.cuh"
#include "backend/cuda/cuda_matmul_units.cuh"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/quant_blocks.h"
#include "tiny_model.h"

namespace tandem::cuda {
namespace {

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                        DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K};

double gamma(int64_t k) { return (double)k * std::ldexp(1.0, -24); }

// A random weight in GGUF bytes, its values as dequantize_row gives them, and per element the
// magnitude of the constant term its block's dot product subtracts.
struct HostWeight {
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  std::vector<uint8_t> raw;   // [rows][row_bytes]
  std::vector<float> value;   // [rows][cols]
  std::vector<float> offset;  // [rows][cols]

  WeightSource source() const {
    WeightSource s;
    s.name = std::string("test.") + std::string(dtype_name(type));
    s.type = type;
    s.data = raw.data();
    s.rows = rows;
    s.cols = cols;
    s.row_bytes = row_bytes;
    return s;
  }
  float w(int64_t r, int64_t c) const { return value[r * cols + c]; }
};

void fill_offsets(HostWeight& h) {
  h.offset.assign(h.value.size(), 0.0f);
  for (int64_t r = 0; r < h.rows; r++) {
    const uint8_t* row = h.raw.data() + r * h.row_bytes;
    float* o = h.offset.data() + r * h.cols;
    for (int64_t c = 0; c < h.cols; c++) {
      switch (h.type) {
        case DType::Q4_0: o[c] = 8 * std::fabs(fp16_to_fp32(reinterpret_cast<const cpu::BlockQ4_0*>(row)[c / 32].d)); break;
        case DType::Q4_1: o[c] = std::fabs(fp16_to_fp32(reinterpret_cast<const cpu::BlockQ4_1*>(row)[c / 32].m)); break;
        case DType::Q4_K: {
          const auto& b = reinterpret_cast<const cpu::BlockQ4_K*>(row)[c / 256];
          uint8_t sc, m;
          cpu::q4_k_scale_min((int)(c % 256) / 32, b.scales, &sc, &m);
          o[c] = std::fabs(fp16_to_fp32(b.dmin) * m);
          break;
        }
        case DType::Q6_K: {
          const auto& b = reinterpret_cast<const cpu::BlockQ6_K*>(row)[c / 256];
          const int e = (int)(c % 256);
          o[c] = 32 * std::fabs(fp16_to_fp32(b.d) * b.scales[(e / 128) * 8 + (e % 32) / 16 + 2 * ((e % 128) / 32)]);
          break;
        }
        default: break;
      }
    }
  }
}

HostWeight make_weight(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  HostWeight h;
  h.type = t;
  h.rows = rows;
  h.cols = cols;
  h.raw = test::random_weights(t, rows, cols, rng, 1.0f);
  h.row_bytes = h.raw.size() / rows;
  h.value.resize(rows * cols);
  for (int64_t r = 0; r < rows; r++)
    EXPECT_TRUE(cpu::dequantize_row(t, h.raw.data() + r * h.row_bytes, h.value.data() + r * cols, cols));
  fill_offsets(h);
  return h;
}

std::vector<float> random_floats(int64_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& e : v) e = nd(rng);
  return v;
}

// The activations the quantized kernels multiply: x [n, cols] through the host twin.
struct Q8Act {
  std::vector<int8_t> q;    // [n, cols]
  std::vector<float2> ds;   // [n, cols / 32]
  std::vector<float> xhat;  // [n, cols]: d * q
};

Q8Act quantize(const std::vector<float>& x, int64_t n, int64_t cols) {
  Q8Act a;
  a.q.resize(n * cols);
  a.ds.resize(n * cols / 32);
  a.xhat.resize(n * cols);
  for (int64_t b = 0; b < n * cols / 32; b++) {
    quantize_block_q8_1(x.data() + b * 32, a.q.data() + b * 32, &a.ds[b].x, &a.ds[b].y);
    for (int i = 0; i < 32; i++) a.xhat[b * 32 + i] = a.ds[b].x * a.q[b * 32 + i];
  }
  return a;
}

// What a product may differ from the float64 reference by, and that reference.
struct Expected {
  double value = 0, tol = 0;
};

// Decode's path (n <= 8): exact against the activations multiplied, bounded against x.
void expect_matvec_result(const HostWeight& h, const std::vector<float>& x, const Q8Act* a, const std::vector<float>& bias,
                          int64_t t, int64_t r, float got, const std::string& where) {
  const bool quant = is_quantized(h.type);
  double exact = bias[r], mag = std::fabs(bias[r]), ref = bias[r], act_bound = 0;
  for (int64_t c0 = 0; c0 < h.cols; c0 += 32) {
    double block_w = 0;
    for (int64_t c = c0; c < std::min<int64_t>(c0 + 32, h.cols); c++) {
      const double w = h.w(r, c), xi = x[t * h.cols + c], xq = quant ? a->xhat[t * h.cols + c] : xi;
      exact += w * xq;
      ref += w * xi;
      mag += (std::fabs(w) + h.offset[r * h.cols + c]) * std::fabs(xq);
      block_w += std::fabs(w);
    }
    if (quant) act_bound += a->ds[(t * h.cols + c0) / 32].x * 0.50001 * block_w;
  }
  const double tol = gamma(h.cols / 8 + 16) * mag + 1e-30;
  ASSERT_NEAR(got, exact, tol) << where << " (against the activations multiplied)";
  ASSERT_NEAR(got, ref, tol + act_bound) << where << " (against the exact input)";
}

// Prefill's path (n > 8): 16-bit rounding of input and (quantized) weight, F32 accumulation.
void expect_gemm_result(const HostWeight& h, const std::vector<float>& x, const std::vector<float>& bias, int64_t t,
                        int64_t r, float got, const std::string& where) {
  const double u16 = h.type == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double sub = std::ldexp(1.0, -25);
  const bool w_rounded = is_quantized(h.type), x_rounded = h.type != DType::F32;
  double ref = bias[r], tol = gamma(h.cols + 2) * std::fabs(bias[r]);
  for (int64_t c = 0; c < h.cols; c++) {
    const double w = std::fabs(h.w(r, c)), xi = std::fabs(x[t * h.cols + c]);
    ref += (double)h.w(r, c) * x[t * h.cols + c];
    double e = gamma(h.cols + 2) * w * xi;
    if (x_rounded) e += w * (u16 * xi + sub);
    if (w_rounded) e += xi * (u16 * w + sub) + (u16 * w + sub) * (u16 * xi + sub);
    tol += e;
  }
  ASSERT_NEAR(got, ref, tol + 1e-30) << where;
}

// ---------------------------------------------------------------------------------------------
// Host: the layout and the work units, with no GPU.

// K-quants need whole 256-element super-blocks; 2304 = 9 of them (72 legacy blocks), so a
// row has more units than a warp has lanes and a partial last round.
constexpr int64_t kRows = 67, kCols = 2304;

std::vector<uint8_t> device_layout(const HostWeight& h) {
  std::vector<uint8_t> packed((size_t)packed_bytes(h.type, h.rows, h.cols));
  if (is_quantized(h.type))
    repack_quantized(h.source(), packed.data());
  else
    std::memcpy(packed.data(), h.raw.data(), packed.size());
  return packed;
}

// cuBLAS is opened at run time, not linked (so a CPU run does not map it): every entry point the
// products use resolves in the toolkit's library. No GPU needed.
TEST(CudaMatmulHost, CublasOpensAtRunTime) {
  auto api = cuda::cublas_api();
  ASSERT_TRUE(api.ok()) << api.error().message;
  EXPECT_NE(api.value()->create, nullptr);
  EXPECT_NE(api.value()->gemm_ex, nullptr);
  EXPECT_NE(api.value()->sgemm, nullptr);
  EXPECT_NE(api.value()->set_workspace, nullptr);
}

TEST(CudaMatmulHost, LayoutDecodesAsDequantizeRow) {
  for (DType t : kTypes) {
    const HostWeight h = make_weight(t, 5, kCols, 1);
    ASSERT_TRUE(validate_weight(h.source()).ok()) << dtype_name(t);
    const std::vector<uint8_t> packed = device_layout(h);
    const WeightView v = weight_view(t, h.rows, h.cols, packed.data());
    ASSERT_EQ(reinterpret_cast<uintptr_t>(v.quants) % 16, 0u);
    ASSERT_EQ(v.q_row_bytes % 16, 0) << dtype_name(t) << ": rows of quants must allow 128-bit loads";
    for (int64_t r = 0; r < h.rows; r++)
      for (int64_t c8 = 0; c8 < h.cols / 8; c8++) {
        float got[8];
        if (is_quantized(t))
          decode8_quant(v, r, c8, got);
        else
          for (int k = 0; k < 8; k++) got[k] = decode_plain(v, r, c8 * 8 + k);
        for (int k = 0; k < 8; k++)
          ASSERT_EQ(got[k], h.w(r, c8 * 8 + k)) << dtype_name(t) << " row " << r << " col " << c8 * 8 + k;
      }
  }
}

template <class Unit>
float host_row(const WeightView& v, int64_t r, const ActRow& a) {
  float acc = 0.0f;
  for (int64_t u = 0; u < Unit::units_per_row(v.cols); u++) acc += Unit::load(v, r, u).dot(a, u);
  return acc;
}

float host_row(const WeightView& v, int64_t r, const ActRow& a) {
  switch (v.type) {
    case DType::F32: return host_row<UnitF32>(v, r, a);
    case DType::F16: return host_row<UnitF16>(v, r, a);
    case DType::BF16: return host_row<UnitBF16>(v, r, a);
    case DType::Q8_0: return host_row<UnitQ8_0>(v, r, a);
    case DType::Q4_0: return host_row<UnitQ4_0>(v, r, a);
    case DType::Q4_1: return host_row<UnitQ4_1>(v, r, a);
    case DType::Q4_K: return host_row<UnitQ4_K>(v, r, a);
    case DType::Q6_K: return host_row<UnitQ6_K>(v, r, a);
    default: return NAN;
  }
}

TEST(CudaMatmulHost, WorkUnitsMatchFloat64Reference) {
  const int64_t n = 3;
  const std::vector<float> x = random_floats(n * kCols, 2);
  const Q8Act a = quantize(x, n, kCols);
  const std::vector<float> no_bias(kRows, 0.0f);
  for (DType t : kTypes) {
    const HostWeight h = make_weight(t, kRows, kCols, 3);
    const std::vector<uint8_t> packed = device_layout(h);
    const WeightView v = weight_view(t, h.rows, h.cols, packed.data());
    for (int64_t tok = 0; tok < n; tok++) {
      const ActRow act{a.q.data() + tok * kCols, a.ds.data() + tok * kCols / 32, x.data() + tok * kCols};
      for (int64_t r = 0; r < kRows && !HasFatalFailure(); r++)
        expect_matvec_result(h, x, &a, no_bias, tok, r, host_row(v, r, act),
                             std::string(dtype_name(t)) + " token " + std::to_string(tok) + " row " + std::to_string(r));
      if (HasFatalFailure()) return;
    }
  }
}

// The largest integer products (weights of 15 or 63, activations of +-127 in every lane) fit
// the kernels' int32 sums: the result equals the float64 product.
TEST(CudaMatmulHost, WorkUnitsExactAtExtremeValues) {
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K}) {
    HostWeight h = make_weight(t, 2, 512, 4);
    for (auto& b : h.raw) b = 0xFF;  // every quant at its largest
    const BlockSplit s = block_split(t);
    for (size_t off = 0; off < h.raw.size(); off += s.block_bytes) {  // modest scales
      const uint16_t d = fp32_to_fp16(0.5f);
      const size_t d_at = t == DType::Q6_K ? 208 : 0;
      std::memcpy(&h.raw[off + d_at], &d, 2);
      if (t == DType::Q4_1 || t == DType::Q4_K) std::memcpy(&h.raw[off + 2], &d, 2);
    }
    for (int64_t r = 0; r < h.rows; r++)
      ASSERT_TRUE(cpu::dequantize_row(t, h.raw.data() + r * h.row_bytes, h.value.data() + r * h.cols, h.cols));
    fill_offsets(h);
    std::vector<float> x(h.cols);
    for (int64_t c = 0; c < h.cols; c++) x[c] = c % 3 ? 1.0f : -1.0f;  // quantizes to +-127 exactly
    const Q8Act a = quantize(x, 1, h.cols);
    const std::vector<uint8_t> packed = device_layout(h);
    const WeightView v = weight_view(t, h.rows, h.cols, packed.data());
    const ActRow act{a.q.data(), a.ds.data(), x.data()};
    const std::vector<float> no_bias(h.rows, 0.0f);
    for (int64_t r = 0; r < h.rows && !HasFatalFailure(); r++)
      expect_matvec_result(h, x, &a, no_bias, 0, r, host_row(v, r, act), std::string(dtype_name(t)) + " extreme");
  }
}

TEST(CudaMatmulHost, UploadRejectsWeightsWithoutAKernel) {
  HostWeight h = make_weight(DType::Q4_0, 2, 64, 5);
  WeightSource s = h.source();
  s.type = DType::Q5_0;
  EXPECT_NE(validate_weight(s).error().message.find("Q5_0 has no CUDA matmul kernel"), std::string::npos);
  s = h.source();
  s.row_bytes += 1;
  EXPECT_NE(validate_weight(s).error().message.find("rows of 37 bytes, but 64 Q4_0 columns take 36"), std::string::npos)
      << validate_weight(s).error().message;
  s = h.source();
  s.cols = 48;
  EXPECT_NE(validate_weight(s).error().message.find("48 columns is not a whole number of 32-element Q4_0 blocks"),
            std::string::npos);
  s = h.source();
  s.compute_supported = false;
  EXPECT_FALSE(validate_weight(s).ok());
  EXPECT_FALSE(matmul_supported(DType::Q5_K));
  for (DType t : kTypes) EXPECT_TRUE(matmul_supported(t)) << dtype_name(t);
}

TEST(CudaMatmulHost, RepackKeepsEveryByte) {
  // Quant bytes and scale bytes together are the block's bytes: the split loses nothing.
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K}) {
    const HostWeight h = make_weight(t, 3, 512, 6);
    const std::vector<uint8_t> packed = device_layout(h);
    const WeightView v = weight_view(t, h.rows, h.cols, packed.data());
    const BlockSplit s = block_split(t);
    ASSERT_EQ(s.q_len + s.m_len, s.block_bytes);
    for (int64_t r = 0; r < h.rows; r++)
      for (int64_t b = 0; b < h.cols / s.block_elems; b++) {
        const uint8_t* src = h.raw.data() + r * h.row_bytes + b * s.block_bytes;
        ASSERT_EQ(0, std::memcmp(v.quants + r * v.q_row_bytes + b * s.q_len, src + s.q_off, s.q_len));
        std::vector<uint8_t> rest(src, src + s.q_off);
        rest.insert(rest.end(), src + s.q_off + s.q_len, src + s.block_bytes);
        ASSERT_EQ(0, std::memcmp(v.meta + r * v.m_row_bytes + b * s.m_len, rest.data(), rest.size()));
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Device: the kernels themselves.

// Skips only where there is no CUDA device; one that is there but broken fails the test.
#define REQUIRE_CUDA_DEVICE()                                                                     \
  do {                                                                                            \
    if (const std::string why = no_cuda_device(); !why.empty()) GTEST_SKIP() << "no CUDA device: " << why; \
    ASSERT_EQ(cudaFree(nullptr), cudaSuccess) << "a CUDA device is present but cannot be used";    \
  } while (0)

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  auto b = device_alloc(v.size() * sizeof(T), "test data");
  EXPECT_TRUE(b.ok());
  EXPECT_EQ(cudaMemcpy(b->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return std::move(*b);
}

std::vector<float> from_device(const void* p, size_t n) {
  std::vector<float> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

class CudaMatmulDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_CUDA_DEVICE();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaMatmulDevice, ProductsMatchFloat64Reference) {
  const int64_t kMaxTokens = 300;
  MatmulWorkspace ws;
  // Tiles of 16 rows: a quantized GEMM of 67 rows runs as 5 tiles, the last partial.
  ws.impl()->dequant_tile_bytes = 16 * 2 * kCols;
  ASSERT_TRUE(ws.reserve(kMaxTokens, kCols, kRows, stream_).ok());
  const std::vector<float> x = random_floats(kMaxTokens * kCols, 7);
  const std::vector<float> bias = random_floats(kRows, 8);
  DeviceBuffer dx = to_device(x), dbias = to_device(bias);
  auto dout = device_alloc(kMaxTokens * kRows * sizeof(float), "test output");
  ASSERT_TRUE(dout.ok());
  for (DType t : kTypes) {
    const HostWeight h = make_weight(t, kRows, kCols, 9);
    auto w = upload_weight(h.source(), stream_);
    ASSERT_TRUE(w.ok()) << w.error().message;
    for (int64_t n : {1, 2, 5, 8, 9, 64, 300}) {
      const float* in = static_cast<const float*>(dx.get());
      float* out = static_cast<float*>(dout->get());
      EXPECT_TRUE(matmul(*w, in, n, out, static_cast<const float*>(dbias.get()), ws, stream_).ok());
      const std::vector<float> got = from_device(out, n * kRows);
      const std::vector<float> xn(x.begin(), x.begin() + n * kCols);
      const Q8Act a = quantize(xn, std::min<int64_t>(n, 8), kCols);
      for (int64_t tok = 0; tok < n; tok++)
        for (int64_t r = 0; r < kRows; r++) {
          const std::string where =
              std::string(dtype_name(t)) + " n=" + std::to_string(n) + " token " + std::to_string(tok) + " row " + std::to_string(r);
          if (n <= kMatvecMaxTokens)
            expect_matvec_result(h, xn, &a, bias, tok, r, got[tok * kRows + r], where);
          else
            expect_gemm_result(h, xn, bias, tok, r, got[tok * kRows + r], where);
          if (HasFatalFailure()) return;
        }
    }
  }
}

// Plain types whose rows do not fit 128-bit units (100 columns) take the scalar kernel.
TEST_F(CudaMatmulDevice, PlainTypesWithUnevenColumns) {
  const int64_t rows = 13, cols = 100, n_max = 20;
  MatmulWorkspace ws;
  ASSERT_TRUE(ws.reserve(n_max, cols, rows, stream_).ok());
  const std::vector<float> x = random_floats(n_max * cols, 10);
  const std::vector<float> bias(rows, 0.0f);
  DeviceBuffer dx = to_device(x);
  auto dout = device_alloc(n_max * rows * sizeof(float), "test output");
  ASSERT_TRUE(dout.ok());
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const HostWeight h = make_weight(t, rows, cols, 11);
    auto w = upload_weight(h.source(), stream_);
    ASSERT_TRUE(w.ok()) << w.error().message;
    for (int64_t n : {1, 3, 20}) {
      float* out = static_cast<float*>(dout->get());
      EXPECT_TRUE(matmul(*w, static_cast<const float*>(dx.get()), n, out, nullptr, ws, stream_).ok());
      const std::vector<float> got = from_device(out, n * rows);
      const std::vector<float> xn(x.begin(), x.begin() + n * cols);
      for (int64_t tok = 0; tok < n; tok++)
        for (int64_t r = 0; r < rows; r++) {
          const std::string where = std::string(dtype_name(t)) + " n=" + std::to_string(n);
          if (n <= kMatvecMaxTokens)
            expect_matvec_result(h, xn, nullptr, bias, tok, r, got[tok * rows + r], where);
          else
            expect_gemm_result(h, xn, bias, tok, r, got[tok * rows + r], where);
          if (HasFatalFailure()) return;
        }
    }
  }
}

TEST_F(CudaMatmulDevice, EmbedEqualsDequantizeRow) {
  const std::vector<int32_t> tokens = {0, 66, 3, 3, 41, -1, 67};  // the last two: outside the table
  DeviceBuffer dtok = to_device(tokens);
  auto dout = device_alloc(tokens.size() * kCols * sizeof(float), "test output");
  ASSERT_TRUE(dout.ok());
  for (DType t : kTypes) {
    const HostWeight h = make_weight(t, kRows, kCols, 12);
    auto w = upload_weight(h.source(), stream_);
    ASSERT_TRUE(w.ok()) << w.error().message;
    EXPECT_TRUE(embed(*w, static_cast<const int32_t*>(dtok.get()), (int64_t)tokens.size(), static_cast<float*>(dout->get()), 1.0f, stream_).ok());
    const std::vector<float> got = from_device(dout->get(), tokens.size() * kCols);
    for (size_t i = 0; i < tokens.size(); i++)
      for (int64_t c = 0; c < kCols; c++) {
        const float g = got[i * kCols + c];
        if (tokens[i] < 0 || tokens[i] >= kRows)
          ASSERT_TRUE(std::isnan(g)) << dtype_name(t) << ": an id outside the table gives NaN";
        else
          ASSERT_EQ(g, h.w(tokens[i], c)) << dtype_name(t) << " token " << tokens[i] << " col " << c;
      }
  }
}

// A group sharing one prepared input gives what separate products give, bit for bit.
TEST_F(CudaMatmulDevice, PreparedGroupEqualsSeparateProducts) {
  MatmulWorkspace ws;
  ASSERT_TRUE(ws.reserve(64, kCols, kRows, stream_).ok());
  const std::vector<float> x = random_floats(64 * kCols, 13);
  DeviceBuffer dx = to_device(x);
  const float* in = static_cast<const float*>(dx.get());
  std::vector<DeviceWeight> ws_group;
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::F16, DType::BF16, DType::Q4_0}) {
    auto w = upload_weight(make_weight(t, kRows, kCols, 14).source(), stream_);
    ASSERT_TRUE(w.ok());
    ws_group.push_back(*w);
  }
  auto a = device_alloc(64 * kRows * sizeof(float), "a"), b = device_alloc(64 * kRows * sizeof(float), "b");
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t n : {1, 8, 64}) {
    prepare_input(in, n, kCols, ws);
    for (const DeviceWeight& w : ws_group) {
      EXPECT_TRUE(matmul_prepared(w, in, n, static_cast<float*>(a->get()), nullptr, ws, stream_).ok());
      const std::vector<float> grouped = from_device(a->get(), n * kRows);
      EXPECT_TRUE(matmul(w, in, n, static_cast<float*>(b->get()), nullptr, ws, stream_).ok());
      const std::vector<float> alone = from_device(b->get(), n * kRows);
      ASSERT_EQ(0, std::memcmp(grouped.data(), alone.data(), grouped.size() * 4)) << dtype_name(w.type) << " n=" << n;
      prepare_input(in, n, kCols, ws);  // matmul() re-prepared: name the group's input again
    }
  }
}

// Products captured in a CUDA graph (nothing may allocate during capture) replay on new input.
TEST_F(CudaMatmulDevice, GraphCaptureReplaysOnNewInput) {
  MatmulWorkspace ws;
  ASSERT_TRUE(ws.reserve(64, kCols, kRows, stream_).ok());
  const HostWeight hq = make_weight(DType::Q4_K, kRows, kCols, 15), hf = make_weight(DType::F16, kRows, kCols, 16);
  auto wq = upload_weight(hq.source(), stream_), wf = upload_weight(hf.source(), stream_);
  ASSERT_TRUE(wq.ok() && wf.ok());
  DeviceBuffer dx = to_device(random_floats(64 * kCols, 17));
  auto out = device_alloc(4 * 64 * kRows * sizeof(float), "out");
  ASSERT_TRUE(out.ok());
  const float* in = static_cast<const float*>(dx.get());
  float* o = static_cast<float*>(out->get());
  auto run = [&](float* dst) {
    EXPECT_TRUE(matmul(*wq, in, 1, dst, nullptr, ws, stream_).ok());
    EXPECT_TRUE(matmul(*wf, in, 8, dst + 64 * kRows, nullptr, ws, stream_).ok());
    EXPECT_TRUE(matmul(*wq, in, 64, dst + 2 * 64 * kRows, nullptr, ws, stream_).ok());
    EXPECT_TRUE(matmul(*wf, in, 64, dst + 3 * 64 * kRows, nullptr, ws, stream_).ok());
  };
  run(o);  // first use outside the capture (as a backend warms up before capturing)
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  run(o);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess) << "a product allocated or synchronized while captured";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // New input, then the replay against the same products run directly.
  const std::vector<float> x2 = random_floats(64 * kCols, 18);
  ASSERT_EQ(cudaMemcpy(dx.get(), x2.data(), x2.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  const std::vector<float> replayed = from_device(o, 4 * 64 * kRows);
  auto direct_buf = device_alloc(4 * 64 * kRows * sizeof(float), "direct");
  ASSERT_TRUE(direct_buf.ok());
  run(static_cast<float*>(direct_buf->get()));
  const std::vector<float> direct = from_device(direct_buf->get(), 4 * 64 * kRows);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (size_t part = 0; part < 4; part++) {
    const size_t n = part == 0 ? 1 : part == 1 ? 8 : 64;
    ASSERT_EQ(0, std::memcmp(replayed.data() + part * 64 * kRows, direct.data() + part * 64 * kRows, n * kRows * 4))
        << "product " << part;
  }
}

// A product the workspace was not reserved for is an error the caller keeps, not an abort():
// one such bug must not take the whole process (a server, a test run) down with it.
TEST_F(CudaMatmulDevice, ProductPastTheWorkspaceIsAnError) {
  MatmulWorkspace ws;
  ASSERT_TRUE(ws.reserve(1, kCols, kRows, stream_).ok());
  auto w = upload_weight(make_weight(DType::Q4_0, kRows, kCols, 19).source(), stream_);
  ASSERT_TRUE(w.ok());
  DeviceBuffer dx = to_device(random_floats(3 * kCols, 20));
  auto out = device_alloc(3 * kRows * sizeof(float), "out");
  ASSERT_TRUE(out.ok());
  const Status s = matmul(*w, static_cast<const float*>(dx.get()), 3, static_cast<float*>(out->get()), nullptr, ws, stream_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("past the reserved workspace"), std::string::npos) << s.error().message;
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << "nothing was launched";
}

TEST_F(CudaMatmulDevice, AllocationTooLargeNamesTheBytes) {
  auto r = device_alloc(size_t(1) << 50, "a test buffer");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("cannot allocate 1125899906842624 bytes"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("for a test buffer"), std::string::npos);
  EXPECT_NE(r.error().message.find("free of"), std::string::npos);
  // The failure is not sticky: the next allocation works.
  EXPECT_TRUE(device_alloc(1024, "a small buffer").ok());
  MatmulWorkspace ws;
  EXPECT_FALSE(ws.reserve(0, 64, 64, stream_).ok());
}

}  // namespace
}  // namespace tandem::cuda

#else  // !TANDEM_HAS_CUDA

TEST(CudaMatmul, NeedsACudaBuild) {
  GTEST_SKIP() << "built without CUDA (TANDEM_CUDA=OFF or no nvcc): the CUDA matmul kernels were not compiled";
}

#endif
