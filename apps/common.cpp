#include "apps/common.h"

#include <algorithm>

#include <fmt/core.h>

#include "model/llama_model.h"

namespace tandem::apps {

int fail(const std::string& msg) {
  fmt::print(stderr, "error: {}\n", msg);
  return 1;
}

Result<std::shared_ptr<CpuBackend>> make_cpu_backend(const std::string& isa, int threads, bool quantized_activations,
                                                     const std::string& exact_products) {
  CpuBackendOptions o;
  if (!cpu::parse_isa(isa, &o.isa)) return make_error("unknown or unsupported --isa '{}'", isa);
  o.threads = threads;
  o.quantized_activations = quantized_activations;
  for (size_t at = 0; exact_products != "none" && at <= exact_products.size();) {
    const size_t comma = std::min(exact_products.find(',', at), exact_products.size());
    if (comma > at) o.exact_products.push_back(exact_products.substr(at, comma - at));
    at = comma + 1;
  }
  return std::make_shared<CpuBackend>(o);
}

const CpuBackend* cpu_backend(const LlamaModel& m) { return dynamic_cast<const CpuBackend*>(&m.backend()); }

}  // namespace tandem::apps
