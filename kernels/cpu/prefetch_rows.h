// Software prefetch of cache rows reached through a pointer list. A sequence's K and V rows
// sit in blocks of 16 positions scattered over the pool (kv/block_pool.h), so the hardware
// prefetcher, which stops at every page, restarts at each block; attention asks for the rows
// a few keys ahead instead.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"

namespace tandem::cpu {

// Bytes of one head's row of D elements of cache type T (Q8_0: blocks of 32 of 34 bytes).
template <DType T, int D>
constexpr int kHeadRowBytes = T == DType::F16 ? 2 * D : T == DType::Q8_0 ? D / 32 * 34 : 4 * D;

// Rows [t0, min(t1, n)) of `rows`, each Bytes long, toward the first-level cache.
template <int Bytes>
inline void prefetch_rows(const uint8_t* const* rows, int64_t t0, int64_t t1, int64_t n) {
  for (int64_t t = t0, end = std::min(t1, n); t < end; t++)
    for (int off = 0; off < Bytes; off += 64) __builtin_prefetch(rows[t] + off, 0, 3);
}

}  // namespace tandem::cpu
