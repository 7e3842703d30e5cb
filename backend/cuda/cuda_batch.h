// A ForwardBatch's arrays as the CUDA kernels read them. The host packs them into one byte
// image (BatchStager, plain host code, tested without a GPU); the backend copies the image
// to one device buffer per pass, so a captured decode graph finds each step's token ids,
// positions, slots and block tables at the same addresses.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/forward_batch.h"

namespace tandem {

using cuda::kAttentionTileRows;  // query rows of one sequence per prefill attention tile

// A batch whose every sequence has at most this many tokens runs the split-K decode kernel.
constexpr int kDecodeMaxSeqTokens = 4;

// Where each array of a staged batch starts in the image (bytes), and its shape.
struct BatchOffsets {
  size_t tokens = 0;     // int32 [n_tokens]
  size_t positions = 0;  // int32 [n_tokens]
  size_t seq_ids = 0;    // int32 [n_tokens]
  size_t slots = 0;      // int64 [n_tokens]
  size_t tables = 0;     // int32 [n_seq, table_stride], -1 past a sequence's last block
  size_t tiles = 0;      // int32 [n_tiles, 2]: first row, row count (rows of one sequence)
  int n_tokens = 0, n_seq = 0, table_stride = 0, n_tiles = 0;
  int max_seq_tokens = 0;  // the most tokens any one sequence has in the batch
  bool decode() const { return max_seq_tokens <= kDecodeMaxSeqTokens; }
};

// The same with device addresses.
struct DeviceBatch {
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* seq_ids = nullptr;
  const int64_t* slots = nullptr;
  const int32_t* tables = nullptr;
  const int32_t* tiles = nullptr;
  BatchOffsets shape;
};

class BatchStager {
 public:
  void reset() { image_.clear(); }
  // Appends the batch's arrays; table rows are padded to a power of two (at least 4 blocks),
  // so a growing context changes the padded width (and a graph's shape) rarely.
  BatchOffsets add_batch(const ForwardBatch& b);
  // Appends n bytes (8-aligned); returns their offset.
  size_t add(const void* data, size_t n);
  std::span<const uint8_t> image() const { return image_; }

 private:
  std::vector<uint8_t> image_;
};

// Prefill tiles of a batch: runs of consecutive rows of one sequence, at most
// kAttentionTileRows each. Exposed for tests.
std::vector<int32_t> attention_tiles(std::span<const int32_t> seq_ids);

}  // namespace tandem
