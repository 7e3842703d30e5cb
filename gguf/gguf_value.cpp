#include "gguf/gguf_value.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace tandem {

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "UINT8";
    case GgufType::INT8: return "INT8";
    case GgufType::UINT16: return "UINT16";
    case GgufType::INT16: return "INT16";
    case GgufType::UINT32: return "UINT32";
    case GgufType::INT32: return "INT32";
    case GgufType::FLOAT32: return "FLOAT32";
    case GgufType::BOOL: return "BOOL";
    case GgufType::STRING: return "STRING";
    case GgufType::ARRAY: return "ARRAY";
    case GgufType::UINT64: return "UINT64";
    case GgufType::INT64: return "INT64";
    case GgufType::FLOAT64: return "FLOAT64";
  }
  return "UNKNOWN";
}

size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8:
    case GgufType::INT8:
    case GgufType::BOOL: return 1;
    case GgufType::UINT16:
    case GgufType::INT16: return 2;
    case GgufType::UINT32:
    case GgufType::INT32:
    case GgufType::FLOAT32: return 4;
    case GgufType::UINT64:
    case GgufType::INT64:
    case GgufType::FLOAT64: return 8;
    case GgufType::STRING:
    case GgufType::ARRAY: return 0;
  }
  return 0;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::UINT8:
    case GgufType::INT8:
    case GgufType::UINT16:
    case GgufType::INT16:
    case GgufType::UINT32:
    case GgufType::INT32:
    case GgufType::UINT64:
    case GgufType::INT64: return true;
    default: return false;
  }
}

template <typename T>
static T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A float read as an integer saturates (NaN reads as 0): a corrupt file's 1e38 must not be
// undefined behaviour; the caller's range check refuses the value.
static int64_t saturating_int64(double d) {
  if (std::isnan(d)) return 0;
  if (d <= -9223372036854775808.0) return INT64_MIN;
  if (d >= 9223372036854775808.0) return INT64_MAX;
  return (int64_t)d;
}

int64_t GgufArray::integer(uint64_t i) const {
  const uint8_t* p = raw + i * gguf_scalar_size(elem_type);
  switch (elem_type) {
    case GgufType::UINT8: return load<uint8_t>(p);
    case GgufType::INT8: return load<int8_t>(p);
    case GgufType::BOOL: return load<uint8_t>(p) != 0;
    case GgufType::UINT16: return load<uint16_t>(p);
    case GgufType::INT16: return load<int16_t>(p);
    case GgufType::UINT32: return load<uint32_t>(p);
    case GgufType::INT32: return load<int32_t>(p);
    case GgufType::UINT64: return (int64_t)load<uint64_t>(p);
    case GgufType::INT64: return load<int64_t>(p);
    case GgufType::FLOAT32: return saturating_int64(load<float>(p));
    case GgufType::FLOAT64: return saturating_int64(load<double>(p));
    default: return 0;
  }
}

double GgufArray::number(uint64_t i) const {
  const uint8_t* p = raw + i * gguf_scalar_size(elem_type);
  switch (elem_type) {
    case GgufType::FLOAT32: return load<float>(p);
    case GgufType::FLOAT64: return load<double>(p);
    case GgufType::UINT64: return (double)load<uint64_t>(p);
    default: return (double)integer(i);
  }
}

std::string gguf_value_summary(const GgufValue& v) {
  if (v.is_array()) {
    const auto& a = *std::get<std::shared_ptr<const GgufArray>>(v.v);
    return fmt::format("[{} x {}]", a.count, gguf_type_name(a.elem_type));
  }
  if (v.is_string()) {
    auto s = std::get<std::string_view>(v.v);
    if (s.size() > 60) return fmt::format("\"{}...\" ({} bytes)", s.substr(0, 60), s.size());
    return fmt::format("\"{}\"", s);
  }
  if (v.type == GgufType::BOOL) return std::get<bool>(v.v) ? "true" : "false";
  if (v.is_float()) return fmt::format("{}", std::get<double>(v.v));
  if (std::holds_alternative<uint64_t>(v.v)) return fmt::format("{}", std::get<uint64_t>(v.v));
  return fmt::format("{}", std::get<int64_t>(v.v));
}

}  // namespace tandem
