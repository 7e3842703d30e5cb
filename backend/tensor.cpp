#include "backend/backend.h"

namespace tandem {

size_t Tensor::row_bytes() const {
  if (dtype == DType::F32) return (size_t)cols * sizeof(float);  // activations: the common case
  const auto info = dtype_info((uint32_t)dtype);
  return info ? tandem::row_bytes(*info, (uint64_t)cols) : 0;
}

Tensor Tensor::rows_view(int64_t first, int64_t n) const {
  Tensor v = *this;
  v.data = static_cast<uint8_t*>(data) + (size_t)first * row_bytes();
  v.rows = n;
  return v;
}

}  // namespace tandem
