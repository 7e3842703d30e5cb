// CPU instruction-set levels with kernels of their own, detected at run time.
#pragma once

#include <string_view>
#include <vector>

namespace tandem::cpu {

// Avx512: AVX-512 F/BW/VL with VNNI, on top of AVX2 (its int8 dot kernels; AVX2 for the rest).
enum class Isa { Scalar, Avx2, Avx512 };

// The best level this CPU runs (AVX2 needs AVX2 + FMA + F16C).
Isa best_isa();
// True for levels that include the AVX2 kernels.
inline bool has_avx2(Isa isa) { return isa == Isa::Avx2 || isa == Isa::Avx512; }
// Every level this CPU runs, scalar first: tests compare each against the scalar twin.
std::vector<Isa> supported_isas();
std::string_view isa_name(Isa isa);
// "scalar", "avx2", "avx512" or "auto"; false for anything else or a level this CPU lacks.
bool parse_isa(std::string_view name, Isa* out);

}  // namespace tandem::cpu
