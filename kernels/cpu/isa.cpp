#include "kernels/cpu/isa.h"

namespace tandem::cpu {

static bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

Isa best_isa() {
  static const Isa best = cpu_has_avx2() ? Isa::Avx2 : Isa::Scalar;
  return best;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> v{Isa::Scalar};
  if (best_isa() == Isa::Avx2) v.push_back(Isa::Avx2);
  return v;
}

std::string_view isa_name(Isa isa) { return isa == Isa::Avx2 ? "avx2" : "scalar"; }

bool parse_isa(std::string_view name, Isa* out) {
  if (name == "auto") {
    *out = best_isa();
    return true;
  }
  if (name == "scalar") {
    *out = Isa::Scalar;
    return true;
  }
  if (name == "avx2" && best_isa() == Isa::Avx2) {
    *out = Isa::Avx2;
    return true;
  }
  return false;
}

}  // namespace tandem::cpu
