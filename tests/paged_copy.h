// A paged copy of contiguous K and V rows, for the attention kernels' tests (test_kernels.cpp,
// test_kernels_kv.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention.h"

namespace tandem::cpu::kernel_test {

// A paged copy of contiguous K and V rows (n_ctx rows each): blocks of bt tokens, K then V in
// each block, block i of the sequence at pool block block_of(i, n_blocks).
struct PagedCopy {
  std::vector<uint8_t> pool;
  std::vector<int32_t> table;
  PagedKvView view;
};
template <typename BlockOf>
inline PagedCopy paged_copy(const std::vector<uint8_t>& k, const std::vector<uint8_t>& v, int64_t n_ctx, int bt,
                     BlockOf block_of) {
  PagedCopy p;
  const int64_t n_blocks = (n_ctx + bt - 1) / bt;
  const size_t row = k.size() / (size_t)n_ctx;
  p.pool.resize((size_t)n_blocks * 2 * bt * row);
  p.table.resize((size_t)n_blocks);
  for (int64_t b = 0; b < n_blocks; b++) p.table[(size_t)b] = (int32_t)block_of(b, n_blocks);
  for (int64_t t = 0; t < n_ctx; t++) {
    uint8_t* at = p.pool.data() + (size_t)p.table[(size_t)(t / bt)] * 2 * bt * row + (size_t)(t % bt) * row;
    std::memcpy(at, k.data() + t * row, row);
    std::memcpy(at + bt * row, v.data() + t * row, row);
  }
  p.view = PagedKvView{p.pool.data(), 2 * bt * row, 0, bt * row, row, bt, p.table.data()};
  return p;
}

}  // namespace tandem::cpu::kernel_test
