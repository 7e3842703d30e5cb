// Micro-benchmark of the CUDA matrix products (backend/cuda/cuda_matmul.h), per weight type:
//   decode: GB/s of the matrix-vector product (n = 1 and n = 8 tokens) over the weight's bytes
//           as stored in the file, cycling through copies that together exceed the L2 cache
//           so every product reads HBM, and replayed from a CUDA graph so launches do not count;
//   prefill: TFLOP/s (2 n rows cols) of the GEMM at n = 512 (quantized: dequantize + cuBLAS).
// Built with TANDEM_CUDA; run: build/bench/tandem_cuda_matmul_bench [rows cols]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_matmul.h"
#include "tests/tiny_model.h"

namespace {

using namespace tandem;
using namespace tandem::cuda;

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    const cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "error: %s: %s\n", #expr, cudaGetErrorString(e_));             \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// A product that failed (cuBLAS, a workspace too small): the bench stops saying why.
void must(const Status& st) {
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.error().message.c_str());
    std::exit(1);
  }
}

constexpr size_t kColdBytes = size_t(512) << 20;  // copies past the H200's 60 MB of L2

struct Timing {
  double us = 0;  // per product
};

// Median over `reps` of the per-product time of a graph replaying `per_graph` products.
template <class F>
double time_graph(cudaStream_t s, int per_graph, int reps, F&& issue) {
  issue(0);  // warm up outside the capture
  CHECK_CUDA(cudaStreamSynchronize(s));
  cudaGraph_t g;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < per_graph; i++) issue(i);
  CHECK_CUDA(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaGraphLaunch(exec, s));
  std::vector<double> us;
  for (int r = 0; r < reps; r++) {
    CHECK_CUDA(cudaEventRecord(a, s));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1000.0 / per_graph);
  }
  std::sort(us.begin(), us.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  return us[us.size() / 2];
}

void bench_type(DType t, int64_t rows, int64_t cols, MatmulWorkspace& ws, const float* x, float* out, cudaStream_t s) {
  std::mt19937 rng(1);
  const std::vector<uint8_t> raw = test::random_weights(t, rows, cols, rng, 0.05f);
  WeightSource src;
  src.name = "bench";
  src.type = t;
  src.data = raw.data();
  src.rows = rows;
  src.cols = cols;
  src.row_bytes = raw.size() / rows;
  const int copies = (int)std::max<size_t>(1, kColdBytes / raw.size());
  std::vector<DeviceWeight> w;
  for (int i = 0; i < copies; i++) {
    auto r = upload_weight(src, s);
    if (!r) {
      std::fprintf(stderr, "error: %s\n", r.error().message.c_str());
      std::exit(1);
    }
    w.push_back(std::move(*r));
  }
  const double gb = (double)raw.size() / 1e9;
  const int per_graph = std::max(copies, 64);
  const double us1 = time_graph(s, per_graph, 15, [&](int i) { must(matmul(w[i % copies], x, 1, out, nullptr, ws, s)); });
  const double us8 = time_graph(s, per_graph, 15, [&](int i) { must(matmul(w[i % copies], x, 8, out, nullptr, ws, s)); });
  const double usg = time_graph(s, 8, 7, [&](int i) { must(matmul(w[i % copies], x, 512, out, nullptr, ws, s)); });
  std::printf("%-5s %6lld x %-6lld %8.2f MB | n=1 %8.2f us %7.0f GB/s | n=8 %8.2f us %7.0f GB/s | n=512 %9.2f us %7.1f TFLOP/s\n",
              std::string(dtype_name(t)).c_str(), (long long)rows, (long long)cols, gb * 1e3, us1, gb / (us1 * 1e-6), us8,
              gb / (us8 * 1e-6), usg, 2.0 * 512 * rows * cols / (usg * 1e-6) / 1e12);
}

}  // namespace

int main(int argc, char** argv) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %.1f GB)\n", prop.name, prop.major, prop.minor, prop.totalGlobalMem / 1e9);
  std::vector<std::pair<int64_t, int64_t>> shapes = {{2048, 8192}, {8192, 2048}};
  if (argc == 3) shapes = {{std::atoll(argv[1]), std::atoll(argv[2])}};
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  for (const auto& [rows, cols] : shapes) {
    MatmulWorkspace ws;
    if (Status st = ws.reserve(512, cols, rows, s); !st) {
      std::fprintf(stderr, "error: %s\n", st.error().message.c_str());
      return 1;
    }
    std::mt19937 rng(2);
    std::normal_distribution<float> nd;
    std::vector<float> hx(512 * cols);
    for (auto& v : hx) v = nd(rng);
    float *x = nullptr, *out = nullptr;
    CHECK_CUDA(cudaMalloc(&x, hx.size() * 4));
    CHECK_CUDA(cudaMalloc(&out, 512 * rows * 4));
    CHECK_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K, DType::F32})
      bench_type(t, rows, cols, ws, x, out, s);
    cudaFree(x);
    cudaFree(out);
  }
  cudaStreamDestroy(s);
  return 0;
}
