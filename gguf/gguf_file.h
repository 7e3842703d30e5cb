// GGUF reader: maps a file, parses header, metadata and tensor infos, and validates every
// count, offset, size and alignment against the file length before any tensor is touched.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "gguf/gguf_value.h"

namespace tandem {

struct GgufTensor {
  std::string name;
  uint32_t type_id = 0;        // GGUF ggml_type id
  DTypeInfo type{};            // geometry of type_id
  std::vector<uint64_t> dims;  // dims[0] is the contiguous (row) length, as GGUF stores it
  uint64_t offset = 0;         // relative to the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping

  DType dtype() const { return static_cast<DType>(type_id); }
  uint64_t n_elements() const;
  uint64_t n_rows() const { return dims.empty() ? 0 : n_elements() / dims[0]; }
  size_t row_size() const { return tandem::row_bytes(type, dims[0]); }
};

class GgufFile {
 public:
  // Maps and parses a file. Errors name the field and the numbers involved.
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parses an in-memory image (tests, fuzzing); the bytes are copied and owned.
  static Result<std::unique_ptr<GgufFile>> from_bytes(const uint8_t* data, size_t size);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // The weights' bytes: every tensor's data, summed (what decode reads per token, all told).
  uint64_t tensor_bytes() const { return tensor_bytes_; }
  const GgufTensor* find_tensor(std::string_view name) const;

  // Drops the resident pages of [p, p + n) of a mapped file (whole pages inside the range):
  // for tensors the engine has copied (repacked, uploaded), so the model is not resident
  // twice. Reading them again faults them back in from the file. A no-op for in-memory files.
  void release_pages(const uint8_t* p, size_t n) const;

  // Typed metadata access. Missing key -> nullopt; present with the wrong type -> error.
  Result<std::optional<uint64_t>> get_uint(std::string_view key) const;
  Result<std::optional<double>> get_float(std::string_view key) const;
  Result<std::optional<bool>> get_bool(std::string_view key) const;
  Result<std::optional<std::string_view>> get_string(std::string_view key) const;
  // Array element access for keys holding arrays (nullptr when missing or not an array).
  const GgufArray* get_array(std::string_view key) const;

 private:
  GgufFile() = default;
  Status parse();

  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;          // mmap region when opened from a path
  std::vector<uint8_t> owned_;       // bytes when parsed from memory
  std::string source_;               // path or "<memory>", for messages

  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t tensor_bytes_ = 0;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// "97.3 MB" style for messages.
std::string human_bytes(uint64_t n);

}  // namespace tandem
