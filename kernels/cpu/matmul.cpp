#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <omp.h>
#include <vector>

#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/work_team.h"

namespace tandem::cpu {

namespace {

struct Tile {
  int p;        // index into the group
  int64_t r0;   // first row
  int64_t nr;   // rows
};

// Float-path rows are decoded to float once per tile only when enough tokens reuse them.
constexpr int64_t kDecodeRowsMinTokens = 4;

// Tokens per pass over a tile's rows: with 16 rows x 128 tokens the activations (up to 48
// blocks per token) and each thread's share of a matrix both stay in L2.
constexpr int64_t kPackedTokenChunk = 128;

// Passes of up to this many tokens go tile by tile with every token, as decode does: one
// kernel call per packed group streams its weights once (kStreamMaxTokens prefetches them).
constexpr int64_t kStreamTokens = kStreamMaxTokens;

// Decode's schedule. Guided hands out shrinking runs, but its first run is half the tiles: on
// a large matrix, a thread whose core streams slower then holds the other one waiting. From
// this many tiles on, runs of 1/32 of a thread's share go out instead (with small matrices
// such runs are a tile or two, and the threads' interleaved tiles stream worse than guided).
constexpr int64_t kDynamicMinTiles = 256;
constexpr int64_t kDynamicChunksPerThread = 32;

// Rows [r0, r0 + nr) (whole 16-row groups) of packed w against tokens [t0, t1) of xq (quant
// types: up to 8 tokens per kernel call) or X (float types: all of them in one call, so the
// AVX2 kernel's 3-token passes run whole: 8-token calls left every fourth pass at 2 tokens).
void packed_tile(const WeightMatrix& w, int64_t r0, int64_t nr, const float* X, const BlockQ8Act* xq, int64_t nb,
                 int64_t t0, int64_t t1, float* out) {
  for (int64_t g = r0; g < r0 + nr; g += kPackRows) {
    const uint8_t* group = w.packed.get() + (g / kPackRows) * w.packed_group_bytes;
    const int valid = (int)std::min<int64_t>(kPackRows, w.rows - g);
    if (w.packed_float_gemm) {
      w.packed_float_gemm(group, w.cols, X + t0 * w.cols, w.cols, (int)(t1 - t0), out + t0 * w.rows + (g - r0), w.rows,
                          valid);
      continue;
    }
    for (int64_t t = t0; t < t1; t += kPackMaxTokens) {
      const int n = (int)std::min<int64_t>(kPackMaxTokens, t1 - t);
      w.packed_gemm(group, w.cols, xq + t * nb, nb, n, out + t * w.rows + (g - r0), w.rows, valid);
    }
  }
}

// One tile of rows against every token, for matrices not done token chunk by token chunk.
// decoded: scratch for tile_rows decoded float rows (float-path weights with many tokens).
void run_tile(std::span<const Projection> group, const Tile& tile, const float* X, int64_t n_tokens,
              const BlockQ8Act* xq, float* decoded, const CpuKernels& k) {
  const WeightMatrix& w = *group[tile.p].w;
  const int64_t cols = w.cols, nb = cols / 32;
  float* out = group[tile.p].out + tile.r0;
  if (w.is_packed()) {
    packed_tile(w, tile.r0, tile.nr, X, xq, nb, 0, n_tokens, out);
  } else if (w.qdot) {
    int64_t t = 0;
    if (w.qdot4) {  // four tokens per weight-row pass
      float res[4];
      for (; t + 4 <= n_tokens; t += 4)
        for (int64_t r = 0; r < tile.nr; r++) {
          w.qdot4(w.row(tile.r0 + r), xq + t * nb, nb, cols, res);
          for (int j = 0; j < 4; j++) out[(t + j) * w.rows + r] = res[j];
        }
    }
    for (; t < n_tokens; t++)
      for (int64_t r = 0; r < tile.nr; r++)
        out[t * w.rows + r] = w.qdot(w.row(tile.r0 + r), xq + t * nb, cols);
  } else if (w.dot_tokens && n_tokens > 1) {  // each sum the float decode's w.dot gives, the row widened once
    for (int64_t r = 0; r < tile.nr; r++) w.dot_tokens(w.row(tile.r0 + r), X, cols, (int)n_tokens, cols, out + r, w.rows);
  } else if (n_tokens < kDecodeRowsMinTokens) {
    for (int64_t t = 0; t < n_tokens; t++)
      for (int64_t r = 0; r < tile.nr; r++) out[t * w.rows + r] = w.dot(w.row(tile.r0 + r), X + t * cols, cols);
  } else {
    for (int64_t r = 0; r < tile.nr; r++) dequantize_row(w.type, w.row(tile.r0 + r), decoded + r * cols, cols);
    int64_t t = 0;
    float res[8];
    for (; t + 4 <= n_tokens; t += 4) {  // 2 rows x 4 tokens per register tile
      int64_t r = 0;
      for (; r + 2 <= tile.nr; r += 2) {
        k.tile_f32(decoded + r * cols, cols, X + t * cols, cols, cols, res);
        for (int j = 0; j < 4; j++) out[(t + j) * w.rows + r] = res[j * 2], out[(t + j) * w.rows + r + 1] = res[j * 2 + 1];
      }
      for (; r < tile.nr; r++)
        for (int j = 0; j < 4; j++) out[(t + j) * w.rows + r] = k.dot_f32(decoded + r * cols, X + (t + j) * cols, cols);
    }
    for (; t < n_tokens; t++)
      for (int64_t r = 0; r < tile.nr; r++) out[t * w.rows + r] = k.dot_f32(decoded + r * cols, X + t * cols, cols);
  }
}

// A group product's plan: the tile list and the quantized input, made by the calling thread
// and read by the team. Decode calls matmul_group ~120 times a token, so both keep their
// memory (the caller's thread_local storage) between calls.
struct GroupPlan {
  std::vector<Tile>& tiles;
  std::vector<BlockQ8Act>& xq;  // [n_tokens, cols / 32]
  int64_t tile_rows = 0;
  bool any_q8 = false, any_decoded = false, any_packed = false;
  bool quantized = false;  // xq already holds every token
  int64_t decode_chunk = 1;
};

// A single token is quantized here; the team splits a batch's.
GroupPlan plan_group(std::span<const Projection> group, const float* X, int64_t n_tokens, const CpuKernels& k,
                     int threads) {
  thread_local std::vector<Tile> tile_store;
  thread_local std::vector<BlockQ8Act> xq_store;
  GroupPlan p{tile_store, xq_store};
  const int64_t cols = group[0].w->cols, nb = cols / 32;
  // Decode and verify-sized passes: small tiles so both threads get even shares; prefill:
  // tiles that stay in cache.
  p.tile_rows = n_tokens <= kStreamTokens ? 32 : 16;
  p.tiles.clear();
  for (size_t g = 0; g < group.size(); g++) {
    const WeightMatrix& w = *group[g].w;
    p.any_q8 |= w.qdot != nullptr || w.packed_gemm != nullptr;
    p.any_packed |= w.is_packed();
    p.any_decoded |= !w.qdot && !w.is_packed() && !w.dot_tokens && n_tokens >= kDecodeRowsMinTokens;
    for (int64_t r0 = 0; r0 < w.rows; r0 += p.tile_rows) p.tiles.push_back({(int)g, r0, std::min(p.tile_rows, w.rows - r0)});
  }
  p.xq.resize(p.any_q8 ? (size_t)(n_tokens * nb) : 0);
  if (p.any_q8 && n_tokens == 1) {  // one token is too small to split
    for (int64_t t = 0; t < n_tokens; t++) k.quantize_act(X + t * cols, p.xq.data() + t * nb, cols);
    p.quantized = true;
  }
  p.decode_chunk = std::max<int64_t>(1, (int64_t)p.tiles.size() / (kDynamicChunksPerThread * threads));
  return p;
}

}  // namespace

void matmul_group(std::span<const Projection> group, const float* X, int64_t n_tokens, const CpuKernels& k) {
  WorkTeam* team = current_team();
  const int threads = team ? team->size() : omp_get_max_threads();
  const GroupPlan p = plan_group(group, X, n_tokens, k, threads);
  const int64_t cols = group[0].w->cols, nb = cols / 32;
  const std::vector<Tile>& tiles = p.tiles;
  const BlockQ8Act* xq = p.xq.data();
  const int64_t n_tiles = (int64_t)tiles.size();
  if (p.any_q8 && !p.quantized)
    parallel_for(n_tokens, Split{1, 1}, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; t++) k.quantize_act(X + t * cols, p.xq.data() + t * nb, cols);
    });
  // Rows decoded to float once per tile (float-path weights with many tokens): each thread's own.
  auto decoded = [&]() -> float* {
    thread_local std::vector<float> store;
    if (p.any_decoded && store.size() < (size_t)(p.tile_rows * cols)) store.resize((size_t)(p.tile_rows * cols));
    return store.data();
  };
  // Packed matrices go token chunk by token chunk, tiles claimed two at a time, chunk after
  // chunk with no wait between them: on this shared host one core often runs slower, and a
  // static split left the other waiting (pp512 615 -> 798 tok/s when this went dynamic). The
  // tile, not the thread, fixes every float.
  if (p.any_packed && n_tokens > kStreamTokens) {
    const int64_t n_chunks = (n_tokens + kPackedTokenChunk - 1) / kPackedTokenChunk;
    parallel_for(n_chunks * n_tiles, Split{2, 0}, [&](int64_t b, int64_t e, int) {
      for (int64_t item = b; item < e; item++) {
        const Tile& tile = tiles[item % n_tiles];
        const int64_t t0 = item / n_tiles * kPackedTokenChunk;
        const WeightMatrix& w = *group[tile.p].w;
        if (w.is_packed())
          packed_tile(w, tile.r0, tile.nr, X, xq, nb, t0, std::min(n_tokens, t0 + kPackedTokenChunk),
                      group[tile.p].out + tile.r0);
      }
    });
  }
  // Decode: guided claims hand out shrinking runs of tiles (half of what is left over the team
  // size, as OpenMP's guided does), so a thread that the machine slows takes fewer of them
  // while each run stays one sequential stream. Smaller first runs (a quarter) cost 6% of
  // decode: every claim moves the claim word between the cores (tg256 paired with the OpenMP
  // team's binary over 12 rounds: 0.94 with quarters, 0.99-1.00 with halves). Large matrices
  // go out in runs of 1/32 of a share. Passes of a few tokens (speculative verify passes, small
  // serving steps) stream the weights as decode does, every tile's rows against all their
  // tokens at once.
  Split split{1, 1};
  if (n_tokens <= kStreamTokens && n_tiles >= kDynamicMinTiles) split = Split{p.decode_chunk, 0};
  const bool all = n_tokens <= kStreamTokens;
  parallel_for(n_tiles, split, [&](int64_t b, int64_t e, int) {
    float* dec = decoded();
    for (int64_t ti = b; ti < e; ti++)
      if (all || !group[tiles[ti].p].w->is_packed()) run_tile(group, tiles[ti], X, n_tokens, xq, dec, k);
  });
}

void WeightMatrix::pack_for(const CpuKernels& k) {
  packed_gemm = k.packed(type);
  if (packed_gemm) {
    packed = pack_rows(type, data, rows, cols, row_bytes);
    packed_group_bytes = cpu::packed_group_bytes(type, cols);
    return;
  }
  if (can_pack_float(type, cols)) packed_float_gemm = k.packed_float(type);
  if (!packed_float_gemm) return;
  packed = pack_float_rows(type, data, rows, cols, row_bytes);
  packed_group_bytes = packed_float_group_bytes(type, cols);
}

void matvec(const WeightMatrix& w, const float* x, float* y, const CpuKernels& k) {
  const Projection p{&w, y};
  matmul_group({&p, 1}, x, 1, k);
}

void matmul(const WeightMatrix& w, const float* X, int64_t n_tokens, float* Y, const CpuKernels& k) {
  const Projection p{&w, Y};
  matmul_group({&p, 1}, X, n_tokens, k);
}

}  // namespace tandem::cpu
