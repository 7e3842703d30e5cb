#include "apps/common.h"

#include <algorithm>

#include <fmt/core.h>

#include "model/model.h"

namespace tandem::apps {

int fail(const std::string& msg) {
  fmt::print(stderr, "error: {}\n", msg);
  return 1;
}

std::vector<std::string> exact_product_names(const std::string& list) {
  std::vector<std::string> names;
  for (size_t at = 0; list != "none" && at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) names.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return names;
}

const CpuBackend* cpu_backend(const Model& m) { return dynamic_cast<const CpuBackend*>(&m.backend()); }

}  // namespace tandem::apps
