#include "backend/cuda/cuda_device.h"

#include <cublas_v2.h>

#include "backend/cuda/cublas_api.h"
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_kernels.h"

namespace tandem::cuda {

namespace {

Status open(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return make_error("no CUDA device: {}", cudaGetErrorString(e));
  if (count == 0) return make_error("no CUDA device: the driver sees no GPU");
  if (device < 0 || device >= count) return make_error("no CUDA device {} (this machine has {})", device, count);
  return check(cudaSetDevice(device), "cudaSetDevice");
}

// Best time in ms of `reps` runs of f on stream s (after `warm` untimed runs).
Result<float> best_ms(cudaStream_t s, int warm, int reps, const std::function<Status()>& f) {
  cudaEvent_t a, b;
  TANDEM_TRY(check(cudaEventCreate(&a), "cudaEventCreate"));
  TANDEM_TRY(check(cudaEventCreate(&b), "cudaEventCreate"));
  float best = 1e30f;
  Status st = Status::Ok();
  for (int i = 0; i < warm + reps && st.ok(); i++) {
    cudaEventRecord(a, s);
    st = f();
    cudaEventRecord(b, s);
    if (st.ok()) st = check(cudaEventSynchronize(b), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= warm) best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (!st.ok()) return st.error();
  return best;
}

struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
};

Result<double> gemm_tflops(cublasHandle_t h, cudaStream_t s, cudaDataType_t type) {
  const int n = 8192;
  DeviceBuffer a, b, c;
  const size_t bytes = (size_t)n * n * 2;
  TANDEM_TRY(check(cudaMalloc(&a.p, bytes), "GEMM probe buffers"));
  TANDEM_TRY(check(cudaMalloc(&b.p, bytes), "GEMM probe buffers"));
  TANDEM_TRY(check(cudaMalloc(&c.p, (size_t)n * n * 4), "GEMM probe buffers"));
  // Small values (0x3c00 halves are 1.0; 0x3c00 bfloat16 is ~0.0078): finite sums, non-zero data.
  TANDEM_TRY(check(cudaMemsetAsync(a.p, 0x3c, bytes, s), "cudaMemset"));
  TANDEM_TRY(check(cudaMemsetAsync(b.p, 0x1c, bytes, s), "cudaMemset"));
  const float one = 1.0f, zero = 0.0f;
  auto ms = best_ms(s, 2, 5, [&]() -> Status {
    const cublasStatus_t r = cublas_api().value()->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a.p, type, n, b.p, type, n,
                                          &zero, c.p, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (r != CUBLAS_STATUS_SUCCESS) return make_error("cublasGemmEx failed ({})", (int)r);
    return Status::Ok();
  });
  if (!ms.ok()) return ms.error();
  return 2.0 * n * n * (double)n / (ms.value() * 1e-3) / 1e12;
}

}  // namespace

Result<GpuInfo> probe_device(int device) {
  TANDEM_TRY(open(device));
  cudaDeviceProp p{};
  TANDEM_TRY(check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties"));
  GpuInfo g;
  g.name = p.name;
  g.compute_major = p.major;
  g.compute_minor = p.minor;
  g.sm_count = p.multiProcessorCount;
  size_t free_b = 0, total_b = 0;
  TANDEM_TRY(check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"));
  g.memory_free = free_b;
  g.memory_total = total_b;
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess)
    g.peak_hbm_gb_s = 2.0 * clock_khz * 1e3 * (bus_bits / 8) / 1e9;  // double data rate
  cudaGetLastError();  // an attribute the driver lacks is no error
  return g;
}

Result<GpuRoofs> measure_roofs(int device) {
  TANDEM_TRY(open(device));
  cudaStream_t s;
  TANDEM_TRY(check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  GpuRoofs r;
  Status st = Status::Ok();
  {
    DeviceBuffer buf, sink;
    const size_t bytes = (size_t)2 << 30;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    st = check(cudaMalloc(&buf.p, bytes), "bandwidth probe buffer (2 GiB)");
    if (st.ok()) st = check(cudaMalloc(&sink.p, (size_t)sms * 8 * sizeof(float)), "bandwidth probe");
    if (st.ok()) st = check(cudaMemsetAsync(buf.p, 0, bytes, s), "cudaMemset");
    if (st.ok()) {
      auto ms = best_ms(s, 2, 5, [&]() -> Status {
        read_probe(buf.p, bytes, static_cast<float*>(sink.p), sms * 8, s);
        return check(cudaGetLastError(), "bandwidth probe kernel");
      });
      if (ms.ok())
        r.read_gb_s = (double)bytes / (ms.value() * 1e-3) / 1e9;
      else
        st = ms.error();
    }
  }
  cublasHandle_t h = nullptr;
  auto api = cublas_api();
  if (st.ok() && !api.ok()) st = api.error();
  if (st.ok() && api.value()->create(&h) != CUBLAS_STATUS_SUCCESS) st = make_error("cublasCreate failed");
  if (st.ok()) {
    api.value()->set_stream(h, s);
    auto f16 = gemm_tflops(h, s, CUDA_R_16F);
    if (f16.ok()) r.tensor_tflops = f16.value(); else st = f16.error();
  }
  if (st.ok()) {
    auto bf16 = gemm_tflops(h, s, CUDA_R_16BF);
    if (bf16.ok()) r.bf16_tflops = bf16.value(); else st = bf16.error();
  }
  if (h) api.value()->destroy(h);
  cudaStreamDestroy(s);
  if (!st.ok()) return st.error();
  return r;
}

}  // namespace tandem::cuda
