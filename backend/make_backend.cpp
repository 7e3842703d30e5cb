#include "backend/make_backend.h"

#include "backend/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"

#ifdef TANDEM_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#endif

namespace tandem {

bool cuda_built() {
#ifdef TANDEM_HAS_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

Result<std::shared_ptr<Backend>> make_cpu(const BackendChoice& c) {
  CpuBackendOptions o;
  if (!cpu::parse_isa(c.isa, &o.isa)) return make_error("unknown or unsupported --isa '{}'", c.isa);
  if (c.threads < 0) return make_error("thread count {} is negative", c.threads);
  o.threads = c.threads;
  o.quantized_activations = c.quantized_activations;
  o.exact_products = c.exact_products;
  return std::shared_ptr<Backend>(std::make_shared<CpuBackend>(o));
}

Result<std::shared_ptr<Backend>> make_cuda(const BackendChoice& c) {
#ifdef TANDEM_HAS_CUDA
  CudaBackendOptions o;
  o.device = c.cuda_device;
  o.graphs = c.cuda_graphs;
  auto be = CudaBackend::create(o);
  if (!be.ok()) return make_error("--device cuda: {}", be.error().message);
  return std::shared_ptr<Backend>(be.value());
#else
  (void)c;
  return make_error("--device cuda: this tandem was built without CUDA (configure with -DTANDEM_CUDA=ON and nvcc)");
#endif
}

}  // namespace

Result<std::shared_ptr<Backend>> make_backend(const BackendChoice& c) {
  if (c.device == "cpu") return make_cpu(c);
  if (c.device == "cuda") return make_cuda(c);
  if (c.device == "auto") {
    if (cuda_built() && probe_gpu(c.cuda_device).ok()) return make_cuda(c);
    return make_cpu(c);
  }
  return make_error("unknown device '{}' (cpu, cuda or auto)", c.device);
}

Result<GpuInfo> probe_gpu(int device) {
#ifdef TANDEM_HAS_CUDA
  return cuda::probe_device(device);
#else
  (void)device;
  return make_error("this tandem was built without CUDA");
#endif
}

Result<GpuRoofs> measure_gpu_roofs(int device) {
#ifdef TANDEM_HAS_CUDA
  return cuda::measure_roofs(device);
#else
  (void)device;
  return make_error("this tandem was built without CUDA");
#endif
}

}  // namespace tandem
