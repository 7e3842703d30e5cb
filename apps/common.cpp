#include "apps/common.h"

#include <omp.h>

#include <fmt/core.h>

namespace tandem::apps {

int fail(const std::string& msg) {
  fmt::print(stderr, "error: {}\n", msg);
  return 1;
}

void set_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

}  // namespace tandem::apps

namespace tandem::apps {
int omp_threads() { return omp_get_max_threads(); }
}  // namespace tandem::apps
