#include "backend/cuda/cuda_batch.h"

#include <algorithm>
#include <cstring>

namespace tandem {

size_t BatchStager::add(const void* data, size_t n) {
  const size_t at = (image_.size() + 7) / 8 * 8;
  image_.resize(at + n);
  if (n) std::memcpy(image_.data() + at, data, n);
  return at;
}

std::vector<int32_t> attention_tiles(std::span<const int32_t> seq_ids) {
  std::vector<int32_t> tiles;
  size_t i = 0;
  while (i < seq_ids.size()) {
    size_t j = i + 1;
    while (j < seq_ids.size() && seq_ids[j] == seq_ids[i] && j - i < (size_t)kAttentionTileRows) j++;
    tiles.push_back((int32_t)i);
    tiles.push_back((int32_t)(j - i));
    i = j;
  }
  return tiles;
}

BatchOffsets BatchStager::add_batch(const ForwardBatch& b) {
  BatchOffsets o;
  const size_t n = (size_t)b.n_tokens();
  o.n_tokens = (int)n;
  o.n_seq = b.n_seq();
  std::vector<int32_t> i32(n);
  o.tokens = add(b.tokens().data(), n * sizeof(int32_t));
  for (size_t i = 0; i < n; i++) i32[i] = (int32_t)b.positions()[i];
  o.positions = add(i32.data(), n * sizeof(int32_t));
  o.seq_ids = add(b.seq_ids().data(), n * sizeof(int32_t));
  o.slots = add(b.slots().data(), n * sizeof(int64_t));

  int stride = 4;
  while (stride < b.max_blocks()) stride *= 2;
  o.table_stride = stride;
  std::vector<int32_t> tables((size_t)o.n_seq * (size_t)stride, -1);
  for (int s = 0; s < o.n_seq; s++) {
    const std::span<const int32_t> t = b.block_table(s);
    std::copy(t.begin(), t.end(), tables.begin() + (ptrdiff_t)s * stride);
  }
  o.tables = add(tables.data(), tables.size() * sizeof(int32_t));

  const std::vector<int32_t> tiles = attention_tiles(b.seq_ids());
  o.n_tiles = (int)(tiles.size() / 2);
  o.tiles = add(tiles.data(), tiles.size() * sizeof(int32_t));

  std::vector<int> per_seq((size_t)o.n_seq, 0);
  for (int32_t s : b.seq_ids()) o.max_seq_tokens = std::max(o.max_seq_tokens, ++per_seq[(size_t)s]);
  return o;
}

}  // namespace tandem
