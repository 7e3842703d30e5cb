// Tensor element types as GGUF numbers them, with their block geometry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

// Values are GGUF's ggml_type ids; do not renumber.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  MXFP4 = 39,  // OCP microscaling FP4: E2M1 codes, one E8M0 scale a block of 32 (gpt-oss experts)
};

struct DTypeInfo {
  std::string_view name;
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
  bool compute_supported;  // tandem has dequant and dot kernels for it
};

// Geometry of a GGUF type id; nullopt for ids tandem does not know.
std::optional<DTypeInfo> dtype_info(uint32_t type_id);
std::string_view dtype_name(DType t);

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(const DTypeInfo& info, uint64_t n) {
  return (size_t)(n / info.block_elems) * info.block_bytes;
}

}  // namespace tandem
