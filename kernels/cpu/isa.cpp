#include "kernels/cpu/isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tandem::cpu {

// CPUID directly (every compiler agrees on its bits): AVX2, FMA and F16C, and the OS saving
// the AVX registers (XGETBV), which a hypervisor may withhold.
static bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), f16c = c & (1u << 29);
  if (!fma || !osxsave || !f16c) return false;
  unsigned xlo, xhi;
  __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & 6) != 6) return false;  // XMM and YMM state enabled
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & (1u << 5);
#else
  return false;
#endif
}

// AVX-512 F, BW, VL and VNNI, with the OS saving the opmask and ZMM state.
static bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  if (!cpu_has_avx2()) return false;
  unsigned xlo, xhi;
  __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & 0xE6) != 0xE6) return false;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool f = b & (1u << 16), bw = b & (1u << 30), vl = b & (1u << 31), vnni = c & (1u << 11);
  return f && bw && vl && vnni;
#else
  return false;
#endif
}

Isa best_isa() {
  static const Isa best = cpu_has_avx512_vnni() ? Isa::Avx512 : cpu_has_avx2() ? Isa::Avx2 : Isa::Scalar;
  return best;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> v{Isa::Scalar};
  if (has_avx2(best_isa())) v.push_back(Isa::Avx2);
  if (best_isa() == Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

std::string_view isa_name(Isa isa) { return isa == Isa::Avx512 ? "avx512" : isa == Isa::Avx2 ? "avx2" : "scalar"; }

bool parse_isa(std::string_view name, Isa* out) {
  if (name == "auto") {
    *out = best_isa();
    return true;
  }
  if (name == "scalar") {
    *out = Isa::Scalar;
    return true;
  }
  if (name == "avx2" && has_avx2(best_isa())) {
    *out = Isa::Avx2;
    return true;
  }
  if (name == "avx512" && best_isa() == Isa::Avx512) {
    *out = Isa::Avx512;
    return true;
  }
  return false;
}

}  // namespace tandem::cpu
