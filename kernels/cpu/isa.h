// CPU instruction-set levels with kernels of their own, detected at run time.
#pragma once

#include <string_view>
#include <vector>

namespace tandem::cpu {

enum class Isa { Scalar, Avx2 };

// The best level this CPU runs (AVX2 needs AVX2 + FMA + F16C).
Isa best_isa();
// Every level this CPU runs, scalar first: tests compare each against the scalar twin.
std::vector<Isa> supported_isas();
std::string_view isa_name(Isa isa);
// "scalar", "avx2" or "auto"; false for anything else or a level this CPU lacks.
bool parse_isa(std::string_view name, Isa* out);

}  // namespace tandem::cpu
