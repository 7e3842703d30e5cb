// Paged causal attention with grouped KV heads: one kernel body in two launch shapes.
//   decode:  a block per (token, KV head, key slice): the token's query heads that share the KV
//            head, over one slice of its keys (split-K, flash-decoding); a second kernel merges
//            the slices by their softmax statistics.
//   prefill: a block per (tile of query rows of one sequence, query head), over every key tile
//            up to the tile's last position (flash attention: online softmax, no score matrix).
// With a sliding window (a.window > 0) a row at position p sees keys [p - window + 1, p]: the
// block starts at its rows' first visible key, and each row masks what lies outside its own.
// Inside a block, 4 warps share each tile of 32 keys (K and V widened to float in shared
// memory); a warp owns up to 4 query rows, a lane one key of the tile for the scores and
// head_dim / 32 output dims. Every length is read from device memory (positions, tables), so
// a captured decode graph stays valid as the context grows.
#include <cuda_fp16.h>

#include <climits>
#include <cmath>

#include "backend/cuda/cuda_kernels.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // query rows per block
static_assert(kAttentionTileRows <= kRows, "a prefill tile's rows must fit one block's");
constexpr int kKeys = 32;                     // keys per tile: one per lane

__host__ __device__ inline size_t head_bytes(int kv_dtype, int hd) {
  return kv_dtype == kKvF32 ? (size_t)hd * 4 : kv_dtype == kKvF16 ? (size_t)hd * 2 : (size_t)hd / 32 * 34;
}

template <int KVT>
__device__ float load_kv(const uint8_t* row, int d) {
  if constexpr (KVT == kKvF32) {
    return reinterpret_cast<const float*>(row)[d];
  } else if constexpr (KVT == kKvF16) {
    return __half2float(reinterpret_cast<const __half*>(row)[d]);
  } else {
    const uint8_t* blk = row + (d / 32) * 34;
    return __half2float(*reinterpret_cast<const __half*>(blk)) * (float)(int8_t)blk[2 + d % 32];
  }
}

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// DV: output dims per lane (head_dim <= 32 * DV). decode: the launch shape (see above).
template <int DV, int KVT>
__global__ void __launch_bounds__(kWarps * 32) attend_kernel(AttentionArgs a, bool decode, int n_split,
                                                             int head_chunks, float* part) {
  extern __shared__ float smem[];
  const int hd = a.head_dim, group = a.n_head / a.n_kv_head;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t q_stride = (int64_t)a.n_head * hd;
  float* qs = smem;                    // [kRows][hd]
  float* ks = qs + kRows * hd;         // [kKeys][hd + 1] (padded: lanes read different keys)
  float* vs = ks + kKeys * (hd + 1);   // [kKeys][hd]

  // This block's rows: (token, head) pairs sharing one sequence and one KV head.
  int64_t tok0;
  int head0, head_step, n_rows, kvh, split = 0;
  if (decode) {
    tok0 = blockIdx.x;
    kvh = blockIdx.y / head_chunks;
    const int chunk = blockIdx.y % head_chunks;
    head0 = kvh * group + chunk * kRows;
    head_step = 1;
    n_rows = min(kRows, group - chunk * kRows);
    split = blockIdx.z;
  } else {
    tok0 = a.tiles[2 * blockIdx.x];
    n_rows = a.tiles[2 * blockIdx.x + 1];
    head0 = blockIdx.y;
    head_step = 0;
    kvh = head0 / group;
  }
  auto token_of = [&](int r) { return decode ? tok0 : tok0 + r; };
  auto head_of = [&](int r) { return head0 + head_step * r; };

  const int32_t* table = a.tables + (int64_t)a.seq_ids[tok0] * a.table_stride;
  // A row at position p sees keys [first_key(p), p].
  auto first_key = [&](int p) { return a.window > 0 && p >= a.window ? p - a.window + 1 : 0; };
  int max_pos = 0, min_first = INT_MAX;
  for (int r = 0; r < n_rows; r++) {
    const int p = a.positions[token_of(r)];
    max_pos = max(max_pos, p);
    min_first = min(min_first, first_key(p));
  }
  int k_begin = n_rows > 0 ? min_first : 0, k_end = max_pos + 1;
  if (decode) {  // one token: its keys [k_begin, k_end) in n_split slices of whole tiles
    const int n_keys = k_end - k_begin;
    const int per = ((n_keys + n_split - 1) / n_split + kKeys - 1) / kKeys * kKeys;
    k_begin = min(k_end, k_begin + split * per);
    k_end = min(k_end, k_begin + per);
  }

  for (int i = threadIdx.x; i < n_rows * hd; i += blockDim.x) {
    const int r = i / hd, d = i % hd;
    qs[i] = a.q[token_of(r) * q_stride + (int64_t)head_of(r) * hd + d];
  }
  int pos[kRowsPerWarp], first[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][DV];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; j++) {
    const int r = warp + kWarps * j;
    pos[j] = r < n_rows ? a.positions[token_of(r)] : -1;
    first[j] = first_key(pos[j]);
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int dv = 0; dv < DV; dv++) o[j][dv] = 0.0f;
  }
  const float scale = a.scale;
  const size_t hb = head_bytes(KVT, hd) * kvh;

  for (int kt = k_begin; kt < k_end; kt += kKeys) {
    __syncthreads();  // the previous tile is consumed (and qs is written, the first time)
    for (int i = threadIdx.x; i < kKeys * hd; i += blockDim.x) {
      const int c = i / hd, d = i % hd, t = kt + c;
      float kv_k = 0.0f, kv_v = 0.0f;
      const int blk = t < k_end ? table[t / a.kv.block_tokens] : -1;
      if (blk >= 0) {
        const uint8_t* row = a.kv.pool + (size_t)blk * a.kv.block_bytes + (size_t)(t % a.kv.block_tokens) * a.kv.row_bytes + hb;
        kv_k = load_kv<KVT>(row + a.kv.k_offset, d);
        kv_v = load_kv<KVT>(row + a.kv.v_offset, d);
      }
      ks[c * (hd + 1) + d] = kv_k;
      vs[c * hd + d] = kv_v;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; j++) {
      const int r = warp + kWarps * j;
      if (r >= n_rows) continue;  // warp-uniform
      const int t = kt + lane;
      const bool valid = t < k_end && t <= pos[j] && t >= first[j];
      float s = -INFINITY;
      if (valid) {
        const float* qr = qs + r * hd;
        const float* kr = ks + lane * (hd + 1);
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc += qr[d] * kr[d];
        s = acc * scale;
      }
      const float m_new = fmaxf(m[j], warp_max(s));
      if (m_new == -INFINITY) continue;  // no key of this tile is visible to the row
      const float p = valid ? expf(s - m_new) : 0.0f;
      const float alpha = expf(m[j] - m_new);
      l[j] = l[j] * alpha + warp_sum(p);
#pragma unroll
      for (int dv = 0; dv < DV; dv++) o[j][dv] *= alpha;
      for (int c = 0; c < kKeys; c++) {
        const float pc = __shfl_sync(0xffffffffu, p, c);
        const float* vr = vs + c * hd;
#pragma unroll
        for (int dv = 0; dv < DV; dv++) {
          const int d = lane + 32 * dv;
          if (d < hd) o[j][dv] += pc * vr[d];
        }
      }
      m[j] = m_new;
    }
  }

#pragma unroll
  for (int j = 0; j < kRowsPerWarp; j++) {
    const int r = warp + kWarps * j;
    if (r >= n_rows) continue;
    const int64_t tok = token_of(r);
    const int h = head_of(r);
    if (decode && n_split > 1) {
      // Unnormalized slice result and its (max, sum); an empty slice has sum 0.
      const int64_t at = (tok * a.n_head + h) * n_split + split;
      float* po = part + at * hd;
#pragma unroll
      for (int dv = 0; dv < DV; dv++)
        if (lane + 32 * dv < hd) po[lane + 32 * dv] = o[j][dv];
      if (lane == 0) {
        float* ml = part + a.n_tokens * a.n_head * n_split * hd + at * 2;
        ml[0] = m[j];
        ml[1] = l[j];
      }
    } else {
      const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
      float* out = a.out + tok * q_stride + (int64_t)h * hd;
#pragma unroll
      for (int dv = 0; dv < DV; dv++)
        if (lane + 32 * dv < hd) out[lane + 32 * dv] = o[j][dv] * inv;
    }
  }
}

// blockIdx.x: token * n_head + head. Weighs each slice by sum * exp(max - overall max).
__global__ void merge_kernel(const float* part, float* out, int64_t n_tokens, int n_head, int hd, int n_split) {
  const int64_t th = blockIdx.x;
  const float* ml = part + n_tokens * n_head * n_split * hd + th * n_split * 2;
  float mx = -INFINITY;
  for (int s = 0; s < n_split; s++)
    if (ml[2 * s + 1] > 0.0f) mx = fmaxf(mx, ml[2 * s]);
  float total = 0.0f;
  for (int s = 0; s < n_split; s++)
    if (ml[2 * s + 1] > 0.0f) total += ml[2 * s + 1] * expf(ml[2 * s] - mx);
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  const float* po = part + th * n_split * hd;
  float* o = out + th * hd;  // [n_tokens, n_head * hd] is [n_tokens * n_head, hd]
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n_split; s++)
      if (ml[2 * s + 1] > 0.0f) acc += po[(int64_t)s * hd + d] * expf(ml[2 * s] - mx);
    o[d] = acc * inv;
  }
}

size_t smem_bytes(int hd) { return sizeof(float) * ((size_t)kRows * hd + (size_t)kKeys * (hd + 1) + (size_t)kKeys * hd); }

template <int DV, int KVT>
void launch(const AttentionArgs& a, dim3 grid, bool decode, int n_split, int head_chunks, float* part, cudaStream_t s) {
  const size_t smem = smem_bytes(a.head_dim);
  // Above 48 KB a kernel must ask for its shared memory: ask once for the most this variant can
  // need (head_dim 32 * DV), so a later, larger head_dim of the same variant still launches.
  // (Per process; a second GPU would need its own call.)
  static const bool raised = [] {
    const size_t most = smem_bytes(32 * DV);
    if (most > 48 * 1024)
      cudaFuncSetAttribute(attend_kernel<DV, KVT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most);
    return true;
  }();
  (void)raised;
  attend_kernel<DV, KVT><<<grid, kWarps * 32, smem, s>>>(a, decode, n_split, head_chunks, part);
}

template <int KVT>
void launch_dv(const AttentionArgs& a, dim3 grid, bool decode, int n_split, int head_chunks, float* part,
               cudaStream_t s) {
  if (a.head_dim <= 64)
    launch<2, KVT>(a, grid, decode, n_split, head_chunks, part, s);
  else if (a.head_dim <= 128)
    launch<4, KVT>(a, grid, decode, n_split, head_chunks, part, s);
  else
    launch<8, KVT>(a, grid, decode, n_split, head_chunks, part, s);
}

void launch_any(const AttentionArgs& a, dim3 grid, bool decode, int n_split, int head_chunks, float* part,
                cudaStream_t s) {
  if (a.kv.kv_dtype == kKvF32)
    launch_dv<kKvF32>(a, grid, decode, n_split, head_chunks, part, s);
  else if (a.kv.kv_dtype == kKvF16)
    launch_dv<kKvF16>(a, grid, decode, n_split, head_chunks, part, s);
  else
    launch_dv<kKvQ8_0>(a, grid, decode, n_split, head_chunks, part, s);
}

int head_chunks_of(const AttentionArgs& a) {
  const int group = a.n_head / a.n_kv_head;
  return (group + kRows - 1) / kRows;
}

}  // namespace

bool attention_supported(int head_dim, int kv_dtype) {
  if (head_dim <= 0 || head_dim > 256 || head_dim % 2) return false;
  return kv_dtype != kKvQ8_0 || head_dim % 32 == 0;
}

int decode_splits(int64_t n_tokens, int n_head, int n_kv_head, int sm_count) {
  const int group = n_head / n_kv_head;
  const int64_t blocks = n_tokens * n_kv_head * ((group + kRows - 1) / kRows);
  const int64_t want = (2 * (int64_t)sm_count + blocks - 1) / blocks;
  return (int)(want < 1 ? 1 : want > 32 ? 32 : want);
}

size_t decode_scratch_floats(int64_t n_tokens, int n_head, int head_dim, int n_split) {
  if (n_split <= 1) return 0;
  return (size_t)n_tokens * n_head * n_split * ((size_t)head_dim + 2);
}

int attention_decode(const AttentionArgs& a, int n_split, float* scratch, cudaStream_t s) {
  if (a.n_tokens <= 0) return 0;
  const int chunks = head_chunks_of(a);
  const dim3 grid((unsigned)a.n_tokens, (unsigned)(a.n_kv_head * chunks), (unsigned)n_split);
  launch_any(a, grid, true, n_split, chunks, scratch, s);
  if (n_split <= 1) return 1;
  merge_kernel<<<(unsigned)(a.n_tokens * a.n_head), a.head_dim < 128 ? 64 : 128, 0, s>>>(scratch, a.out, a.n_tokens,
                                                                                         a.n_head, a.head_dim, n_split);
  return 2;
}

int attention_prefill(const AttentionArgs& a, cudaStream_t s) {
  if (a.n_tiles <= 0) return 0;
  const dim3 grid((unsigned)a.n_tiles, (unsigned)a.n_head, 1);
  launch_any(a, grid, false, 1, 1, nullptr, s);
  return 1;
}

}  // namespace tandem::cuda
