// Plain scalar dequantization of any supported type: the reference every SIMD path is tested against.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tandem::cpu {

// Writes n floats decoded from src (n a multiple of the type's block size).
// Returns false for a type tandem has no kernel for.
bool dequantize_row(DType type, const void* src, float* dst, int64_t n);

}  // namespace tandem::cpu
