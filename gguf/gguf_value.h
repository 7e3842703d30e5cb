// GGUF metadata values: scalars, strings and (possibly nested) arrays, viewing the mapped file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tandem {

// Value type ids as GGUF defines them.
enum class GgufType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

std::string_view gguf_type_name(GgufType t);
// Size in bytes of a fixed-size scalar type; 0 for STRING and ARRAY.
size_t gguf_scalar_size(GgufType t);

struct GgufArray;

struct GgufValue {
  GgufType type = GgufType::UINT8;
  // Integers are widened to int64/uint64, floats to double; strings view the file.
  std::variant<uint64_t, int64_t, double, bool, std::string_view, std::shared_ptr<const GgufArray>> v;

  bool is_integer() const;
  bool is_float() const { return type == GgufType::FLOAT32 || type == GgufType::FLOAT64; }
  bool is_string() const { return type == GgufType::STRING; }
  bool is_array() const { return type == GgufType::ARRAY; }
};

struct GgufArray {
  GgufType elem_type = GgufType::UINT8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;          // numeric elements, little-endian, possibly unaligned
  std::vector<std::string_view> strings;  // when elem_type == STRING
  std::vector<GgufValue> arrays;          // when elem_type == ARRAY

  // Element i of a numeric array widened to double / int64 (caller checks bounds).
  double number(uint64_t i) const;
  int64_t integer(uint64_t i) const;
};

// Short printable form for listings ("[49152 x STRING]", "100000", "\"llama\"").
std::string gguf_value_summary(const GgufValue& v);

}  // namespace tandem
