#include "core/dtype.h"

namespace tandem {

std::optional<DTypeInfo> dtype_info(uint32_t id) {
  switch (static_cast<DType>(id)) {
    case DType::F32: return DTypeInfo{"F32", 1, 4, true};
    case DType::F16: return DTypeInfo{"F16", 1, 2, true};
    case DType::BF16: return DTypeInfo{"BF16", 1, 2, true};
    case DType::Q4_0: return DTypeInfo{"Q4_0", 32, 18, true};
    case DType::Q4_1: return DTypeInfo{"Q4_1", 32, 20, true};
    case DType::Q5_0: return DTypeInfo{"Q5_0", 32, 22, true};
    case DType::Q5_1: return DTypeInfo{"Q5_1", 32, 24, true};
    case DType::Q8_0: return DTypeInfo{"Q8_0", 32, 34, true};
    case DType::Q8_1: return DTypeInfo{"Q8_1", 32, 36, false};
    case DType::Q2_K: return DTypeInfo{"Q2_K", 256, 84, false};
    case DType::Q3_K: return DTypeInfo{"Q3_K", 256, 110, false};
    case DType::Q4_K: return DTypeInfo{"Q4_K", 256, 144, true};
    case DType::Q5_K: return DTypeInfo{"Q5_K", 256, 176, true};
    case DType::Q6_K: return DTypeInfo{"Q6_K", 256, 210, true};
    case DType::Q8_K: return DTypeInfo{"Q8_K", 256, 292, false};
    case DType::I8: return DTypeInfo{"I8", 1, 1, false};
    case DType::I16: return DTypeInfo{"I16", 1, 2, false};
    case DType::I32: return DTypeInfo{"I32", 1, 4, false};
    case DType::I64: return DTypeInfo{"I64", 1, 8, false};
    case DType::F64: return DTypeInfo{"F64", 1, 8, false};
    case DType::MXFP4: return DTypeInfo{"MXFP4", 32, 17, true};
  }
  return std::nullopt;
}

std::string_view dtype_name(DType t) {
  auto info = dtype_info(static_cast<uint32_t>(t));
  return info ? info->name : std::string_view("unknown");
}

}  // namespace tandem
