#include "kv/kv_cache.h"

#include <cstring>
#include <new>

namespace tandem {

Result<KvCache> KvCache::create(const KvCacheShape& shape) {
  if (shape.dtype != DType::F16 && shape.dtype != DType::F32)
    return make_error("KV cache dtype {} is not supported (use f16 or f32)", dtype_name(shape.dtype));
  if (shape.n_layer <= 0 || shape.n_kv_head <= 0 || shape.head_dim <= 0 || shape.max_tokens <= 0)
    return make_error("KV cache shape must be positive (layers {}, kv heads {}, head dim {}, tokens {})",
                      shape.n_layer, shape.n_kv_head, shape.head_dim, shape.max_tokens);
  KvCache c;
  c.shape_ = shape;
  const size_t elem = shape.dtype == DType::F16 ? 2 : 4;
  c.bytes_ = kv_cache_bytes(shape.n_layer, shape.n_kv_head, shape.max_tokens, shape.head_dim, elem);
  c.layer_bytes_ = c.bytes_ / (2 * (size_t)shape.n_layer);
  c.data_.reset(new (std::nothrow) uint8_t[c.bytes_]);
  if (!c.data_) return make_error("cannot allocate a KV cache of {} bytes", c.bytes_);
  return c;
}

}  // namespace tandem
