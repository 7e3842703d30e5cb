#include "backend/make_backend.h"

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "gguf/gguf_file.h"
#include "kernels/cpu/isa.h"

#ifdef TANDEM_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#endif

namespace tandem {

// --exact-products auto: on models under this many parameters whose output head is at most
// this share of them, the head keeps f32 activations. Measured (docs/usage.md, "Accuracy and
// defaults"): on SmolLM2-135M (head 21% of the parameters) it halves the top-1 misses that
// 8-bit activations cause and answers the README's chat example right, for 6% of decode
// speed when chosen (~20% since the 8-bit body got faster: docs/usage.md); on a 1B Q4_0 with a
// 128k-token head it would cost 45% of decode, and on Gemma 3 270M (a 262k-token head, 63% of
// the parameters) 28% of decode for 0.3 points of top-1 agreement.
constexpr uint64_t kExactHeadMaxParams = 500'000'000;
constexpr double kExactHeadMaxShare = 1.0 / 3.0;

std::vector<std::string> exact_products_for(const std::string& option, const GgufFile& f) {
  std::string list = option;
  if (option == "auto") {
    uint64_t params = 0;
    for (const auto& t : f.tensors()) params += t.n_elements();
    const GgufTensor* head = f.find_tensor("output.weight");
    if (!head) head = f.find_tensor("token_embd.weight");  // tied
    const double share = head && params ? (double)head->n_elements() / (double)params : 1.0;
    list = params < kExactHeadMaxParams && share <= kExactHeadMaxShare ? "output,token_embd" : "none";
  }
  std::vector<std::string> names;
  for (size_t at = 0; list != "none" && at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) names.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return names;
}

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
