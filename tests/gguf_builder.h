// Writes GGUF images in memory for tests: valid files, and the raw bytes to corrupt them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf_value.h"

namespace tandem::test {

class GgufBuilder {
 public:
  void kv_u32(const std::string& k, uint32_t v) { key(k, GgufType::UINT32), put(v); }
  void kv_i32(const std::string& k, int32_t v) { key(k, GgufType::INT32), put(v); }
  void kv_f32(const std::string& k, float v) { key(k, GgufType::FLOAT32), put(v); }
  void kv_bool(const std::string& k, bool v) { key(k, GgufType::BOOL), put((uint8_t)v); }
  void kv_str(const std::string& k, const std::string& v) { key(k, GgufType::STRING), str(v); }
  void kv_str_array(const std::string& k, const std::vector<std::string>& v) {
    key(k, GgufType::ARRAY), put((uint32_t)GgufType::STRING), put((uint64_t)v.size());
    for (const auto& s : v) str(s);
  }
  void kv_f32_array(const std::string& k, const std::vector<float>& v) {
    key(k, GgufType::ARRAY), put((uint32_t)GgufType::FLOAT32), put((uint64_t)v.size());
    for (float f : v) put(f);
  }
  void kv_i32_array(const std::string& k, const std::vector<int32_t>& v) {
    key(k, GgufType::ARRAY), put((uint32_t)GgufType::INT32), put((uint64_t)v.size());
    for (int32_t x : v) put(x);
  }
  // dims[0] is the row length. data must be the tensor's exact bytes.
  void tensor(const std::string& name, DType type, std::vector<uint64_t> dims, std::vector<uint8_t> data) {
    tensors_.push_back({name, type, std::move(dims), std::move(data)});
  }

  // The whole file: header, metadata, tensor infos, aligned data.
  std::vector<uint8_t> build(uint32_t alignment = 32) const {
    std::vector<uint8_t> out;
    auto w = [&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
    const uint32_t magic = 0x46554747, version = 3;
    const uint64_t nt = tensors_.size(), nkv = n_kv_;
    w(&magic, 4), w(&version, 4), w(&nt, 8), w(&nkv, 8);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      const uint64_t len = t.name.size();
      w(&len, 8), w(t.name.data(), len);
      const uint32_t nd = (uint32_t)t.dims.size();
      w(&nd, 4);
      for (uint64_t d : t.dims) w(&d, 8);
      const uint32_t ty = (uint32_t)t.type;
      w(&ty, 4), w(&offset, 8);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (out.size() % alignment) out.push_back(0);
    for (const auto& t : tensors_) {
      out.insert(out.end(), t.data.begin(), t.data.end());
      while (out.size() % alignment) out.push_back(0);
    }
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> data;
  };
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    kv_.insert(kv_.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put((uint64_t)s.size());
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void key(const std::string& k, GgufType t) {
    str(k);
    put((uint32_t)t);
    n_kv_++;
  }
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace tandem::test
