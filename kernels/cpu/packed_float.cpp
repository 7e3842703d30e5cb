#include "kernels/cpu/packed_float.h"

#include <cmath>
#include <cstring>
#include <new>

#include "core/fp16.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/work_team.h"

namespace tandem::cpu {

bool can_pack_float(DType t, int64_t cols) { return (t == DType::F16 || t == DType::BF16) && cols % 2 == 0; }

size_t packed_float_group_bytes(DType t, int64_t cols) {
  return can_pack_float(t, cols) ? (size_t)cols * kPackRows * 2 : 0;  // a multiple of 64
}

std::shared_ptr<uint8_t[]> pack_float_rows(DType t, const uint8_t* data, int64_t rows, int64_t cols,
                                           size_t row_bytes) {
  const int64_t groups = (rows + kPackRows - 1) / kPackRows;
  const size_t gbytes = packed_float_group_bytes(t, cols), total = (size_t)groups * gbytes;
  std::shared_ptr<uint8_t[]> out = allocate_packed(total);
  uint8_t* mem = out.get();
  // Loading a model is mostly this and pack_rows: on the backend's team in its scope.
  parallel_for(groups, Split{16, 0}, [&](int64_t g0, int64_t g1, int) {
    for (int64_t g = g0; g < g1; g++) {
      auto* group = reinterpret_cast<uint16_t*>(mem + g * gbytes);
      for (int r = 0; r < kPackRows && g * kPackRows + r < rows; r++) {
        const auto* row = reinterpret_cast<const uint16_t*>(data + (size_t)(g * kPackRows + r) * row_bytes);
        for (int64_t k = 0; k < cols; k++) group[k * kPackRows + r] = row[k];
      }
    }
  });
  return out;
}

void packed_float_gemm_scalar(DType t, const uint8_t* group, int64_t cols, const float* x, int64_t x_stride,
                              int n_tokens, float* out, int64_t out_stride, int valid_rows) {
  const auto* w = reinterpret_cast<const uint16_t*>(group);
  auto widen = [t](uint16_t v) { return t == DType::F16 ? fp16_to_fp32(v) : bf16_to_fp32(v); };
  for (int tok = 0; tok < n_tokens; tok++)
    for (int r = 0; r < valid_rows; r++) {
      const float* xt = x + tok * x_stride;
      float even = 0.0f, odd = 0.0f;
      for (int64_t k = 0; k < cols; k += 2) {
        even = std::fma(widen(w[k * kPackRows + r]), xt[k], even);
        odd = std::fma(widen(w[(k + 1) * kPackRows + r]), xt[k + 1], odd);
      }
      out[tok * out_stride + r] = even + odd;
    }
}

}  // namespace tandem::cpu
