#include "apps/common.h"

#include <fmt/core.h>

#include "model/model.h"

namespace tandem::apps {

int fail(const std::string& msg) {
  fmt::print(stderr, "error: {}\n", msg);
  return 1;
}

const CpuBackend* cpu_backend(const Model& m) { return dynamic_cast<const CpuBackend*>(&m.backend()); }

}  // namespace tandem::apps
