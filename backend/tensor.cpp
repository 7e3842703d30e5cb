#include "backend/backend.h"

#include <cstdio>
#include <cstdlib>

namespace tandem {

size_t Tensor::row_bytes() const {
  if (dtype == DType::F32) return (size_t)cols * sizeof(float);  // activations: the common case
  const auto info = dtype_info((uint32_t)dtype);
  return info ? tandem::row_bytes(*info, (uint64_t)cols) : 0;
}

void Backend::embed_shard(const Weight& table, int64_t first_row, const ForwardBatch& b, const Tensor& out,
                          float scale) {
  // Only reached when runs_tensor_parallel() said true without overriding this: a bug.
  std::fprintf(stderr, "tandem: backend %s cannot embed a vocabulary shard\n", describe().c_str());
  std::abort();
}

void Backend::all_reduce(const Tensor& t, Collectives& c) {
  c.all_reduce_sum(static_cast<float*>(t.data), (size_t)(t.rows * t.cols));
}

void Backend::gather_columns(const Tensor&, const Tensor&, std::span<const int64_t>, Collectives&) {
  // As embed_shard: a backend that runs tensor parallel overrides this.
  std::fprintf(stderr, "tandem: backend %s cannot gather column shares\n", describe().c_str());
  std::abort();
}

void Backend::moe_route(const Tensor&, const MoeRouting&, const Tensor&) {
  // Only reached when runs_moe() said true without overriding this: a bug (models with experts
  // are refused at load by a backend that does not run them).
  std::fprintf(stderr, "tandem: backend %s cannot route experts\n", describe().c_str());
  std::abort();
}

void Backend::moe_ffn(const Tensor&, const Tensor&, int, const ExpertWeights&, GateActivation, const Tensor&) {
  std::fprintf(stderr, "tandem: backend %s cannot run experts\n", describe().c_str());
  std::abort();
}

Tensor Tensor::rows_view(int64_t first, int64_t n) const {
  Tensor v = *this;
  v.data = static_cast<uint8_t*>(data) + (size_t)first * row_bytes();
  v.rows = n;
  return v;
}

}  // namespace tandem

namespace tandem {

Result<size_t> kv_row_bytes(DType dtype, int n_kv_head, int head_dim) {
  if (n_kv_head <= 0 || head_dim <= 0) return make_error("bad KV row shape ({} heads of {})", n_kv_head, head_dim);
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::Q8_0)
    return make_error("the KV cache holds f32, f16 or q8_0, not {}", dtype_name(dtype));
  const DTypeInfo info = *dtype_info((uint32_t)dtype);
  if (head_dim % (int)info.block_elems != 0)
    return make_error("a {} KV cache needs head_dim a multiple of {}; this model's is {}", dtype_name(dtype),
                      info.block_elems, head_dim);
  return (size_t)n_kv_head * row_bytes(info, (uint64_t)head_dim);
}

Result<KvStore> kv_store_layout(DType dtype, int n_layer, int block_tokens, int64_t n_blocks, size_t row_bytes) {
  KvStore kv{nullptr, dtype, n_layer, block_tokens, n_blocks, row_bytes, {}};
  if (n_layer <= 0 || block_tokens <= 0 || n_blocks <= 0 || row_bytes == 0)
    return make_error("bad KV store shape ({} layers, {} tokens per block, {} blocks, {} bytes per row)", n_layer,
                      block_tokens, n_blocks, row_bytes);
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::Q8_0)
    return make_error("the KV cache holds f32, f16 or q8_0, not {}", dtype_name(dtype));
  if (kv.bytes() / (uint64_t)n_blocks != kv.block_bytes()) return make_error("a KV store of {} blocks overflows", n_blocks);
  return kv;
}

}  // namespace tandem
