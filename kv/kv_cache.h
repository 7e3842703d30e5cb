// The KV cache of one sequence: K and V rows of every layer for up to max_tokens positions,
// preallocated once. Its size is the seed's formula, and the allocation is exactly that.
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

// 2 x layers x kv_heads x seq_len x head_dim x bytes_per_element x batch.
constexpr uint64_t kv_cache_bytes(uint64_t n_layer, uint64_t n_kv_head, uint64_t seq_len, uint64_t head_dim,
                                  uint64_t bytes_per_element, uint64_t batch = 1) {
  return 2 * n_layer * n_kv_head * seq_len * head_dim * bytes_per_element * batch;
}

struct KvCacheShape {
  int n_layer = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int64_t max_tokens = 0;
  DType dtype = DType::F16;  // F16 or F32
};

class KvCache {
 public:
  static Result<KvCache> create(const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  int64_t size() const { return n_tokens_; }  // positions filled
  int64_t capacity() const { return shape_.max_tokens; }
  uint64_t allocated_bytes() const { return bytes_; }
  int64_t row_elems() const { return (int64_t)shape_.n_kv_head * shape_.head_dim; }
  size_t elem_bytes() const { return shape_.dtype == DType::F16 ? 2 : 4; }

  // [max_tokens, n_kv_head * head_dim] of dtype.
  void* k(int layer) { return data_.get() + (size_t)(2 * layer) * layer_bytes_; }
  void* v(int layer) { return data_.get() + (size_t)(2 * layer + 1) * layer_bytes_; }
  const void* k(int layer) const { return data_.get() + (size_t)(2 * layer) * layer_bytes_; }
  const void* v(int layer) const { return data_.get() + (size_t)(2 * layer + 1) * layer_bytes_; }

  // Marks n more positions filled (after every layer stored them: the backend's store_kv).
  void advance(int64_t n) { n_tokens_ += n; }
  // Forgets positions from n on (rewind), or all of them.
  void truncate(int64_t n) { n_tokens_ = n < n_tokens_ ? n : n_tokens_; }
  void clear() { n_tokens_ = 0; }

 private:
  KvCacheShape shape_;
  size_t layer_bytes_ = 0;  // one of K or V for one layer
  uint64_t bytes_ = 0;
  int64_t n_tokens_ = 0;
  std::unique_ptr<uint8_t[]> data_;
};

}  // namespace tandem
