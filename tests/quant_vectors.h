// Records of quantized blocks and their values as the `gguf` Python package decodes them
// (tests/reference/make_quant_vectors.py writes the files under tests/data).
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tandem::test {

struct QuantVector {
  DType type;
  std::vector<uint8_t> raw;
  std::vector<float> values;  // as the gguf Python package decodes them
};

// Per record: u32 ggml type id, u32 element count, u32 byte count, the raw blocks, then the
// float32 values. `file` is relative to tests/data; a missing file gives no records.
inline std::vector<QuantVector> load_quant_vectors(const std::string& file) {
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/tests/data/" + file, std::ios::binary);
  std::vector<QuantVector> out;
  uint32_t hdr[3];
  while (f.read(reinterpret_cast<char*>(hdr), sizeof(hdr))) {
    QuantVector v{static_cast<DType>(hdr[0]), std::vector<uint8_t>(hdr[2]), std::vector<float>(hdr[1])};
    f.read(reinterpret_cast<char*>(v.raw.data()), hdr[2]);
    f.read(reinterpret_cast<char*>(v.values.data()), hdr[1] * 4);
    out.push_back(std::move(v));
  }
  return out;
}

// sum w[i] x[i] in float64, and sum |w[i] x[i]| (what a float sum's rounding scales with).
struct Dot64 {
  double sum = 0, mag = 0;
};
inline Dot64 dot64(const float* w, const float* x, int64_t n) {
  Dot64 d;
  for (int64_t i = 0; i < n; i++) d.sum += (double)w[i] * x[i], d.mag += std::fabs((double)w[i] * x[i]);
  return d;
}

}  // namespace tandem::test
