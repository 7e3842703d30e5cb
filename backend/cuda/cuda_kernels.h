// Launchers of the CUDA backend's own kernels (cuda_ops.cu: element-wise and per-row work;
// cuda_attention.cu: paged attention). Each enqueues on `stream`, allocates nothing and
// reads per-step lengths (positions, slots, tables) from device memory, so a captured graph
// replays them for later steps. Their math is the CPU's (kernels/cpu/ops.cpp, attention.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

// Query rows of one sequence per prefill attention tile: the batch staging (cuda_batch) cuts
// tiles this tall and the attention kernel gives each tile one block of this many rows.
constexpr int kAttentionTileRows = 16;

// out = x / rms(x) * w over each `width`-wide piece of each row (width == cols: whole rows).
// x, out: [rows, cols]; w: [width]. The sum of squares in double, as the CPU's.
// out may be x (in place): a thread writes only the elements it read itself, after the sum.
int rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t cols, int64_t width, float eps,
            cudaStream_t s);
// x += delta * delta_scale; then out = rmsnorm(x) * norm when norm is set (one read of x).
int add_residual(float* x, const float* delta, float delta_scale, const float* norm, float* out, int64_t rows,
                 int64_t cols, float eps, cudaStream_t s);
// scratch[r] = rmsnorm(x[rows[r]]) * norm for r < n_rows: the logit rows gathered and normed.
int gather_rmsnorm(const float* x, const int32_t* rows, int64_t n_rows, const float* norm, float* scratch,
                   int64_t cols, float eps, cudaStream_t s);
// out[t] = cos, sin pairs of positions[t] * inv_freq[i], computed in double.
int rope_angles(const int32_t* positions, const double* inv_freq, int rope_dim, float* out, int64_t out_cols,
                int64_t n_tokens, cudaStream_t s);
// Rotates pairs of the first rope_dim dims of each head of q and k, in place: adjacent pairs
// (x[2i], x[2i+1]), or with neox the halves (x[i], x[i + rope_dim/2]); pair i by angle i.
int rope(float* q, int64_t q_cols, int n_head, float* k, int64_t k_cols, int n_kv_head, int head_dim, int rope_dim,
         bool neox, const float* angles, int64_t angle_cols, int64_t n_tokens, cudaStream_t s);
// gate = act(gate) * up: SiLU, or GELU's tanh form evaluated as the CPU's vector kernels do,
// g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3)).
enum GateAct : int { kGateSilu = 0, kGateGeluTanh = 1 };
int gated_activation(float* gate, const float* up, int64_t rows, int64_t cols, int act, cudaStream_t s);
// y *= scale (when not 1), then y = softcap * tanh(y / softcap) (when softcap > 0), over
// n floats: the logits' last step.
int scale_softcap(float* y, int64_t n, float scale, float softcap, cudaStream_t s);

// A layer's view of the paged KV store.
struct KvView {
  uint8_t* pool = nullptr;
  size_t block_bytes = 0, k_offset = 0, v_offset = 0, row_bytes = 0;
  int block_tokens = 0;
  int kv_dtype = 0;  // KvDType
};
enum KvDType : int { kKvF32 = 0, kKvF16 = 1, kKvQ8_0 = 2 };

// Writes row t of k and v ([n_tokens, width] each) at slots[t], rounded to the store's dtype
// (Q8_0: GGML's block_q8_0, d = max|x| / 127 as fp16, q = round(x / d)).
int store_kv(const float* k, const float* v, int64_t width, int64_t n_tokens, const int64_t* slots, const KvView& kv,
             cudaStream_t s);

struct AttentionArgs {
  const float* q = nullptr;  // [n_tokens, n_head * head_dim]
  float* out = nullptr;      // [n_tokens, n_head * head_dim]
  KvView kv;
  const int32_t* positions = nullptr;  // [n_tokens]
  const int32_t* seq_ids = nullptr;    // [n_tokens]
  const int32_t* tables = nullptr;     // [n_seq, table_stride]
  int table_stride = 0;
  const int32_t* tiles = nullptr;  // [n_tiles, 2] (prefill)
  int n_tiles = 0;
  int64_t n_tokens = 0;
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  float scale = 0;  // scores = q . k * scale
  int window = 0;   // > 0: a query at position p sees keys p' with p - p' < window
};

// Split-K (flash-decoding) attention: each token's heads of one KV head, over n_split slices
// of its keys; partial results in scratch, merged by a second kernel (none when n_split is 1).
// Returns the kernels launched; scratch holds decode_scratch_floats(...) floats.
int attention_decode(const AttentionArgs& a, int n_split, float* scratch, cudaStream_t s);
size_t decode_scratch_floats(int64_t n_tokens, int n_head, int head_dim, int n_split);
// Slices per (token, KV head) that fill the GPU about twice over: a function of the batch's
// shape only, so it is the same at every decode step.
int decode_splits(int64_t n_tokens, int n_head, int n_kv_head, int sm_count);
// Tiled (flash-attention) kernel for prefill chunks: a tile of query rows of one sequence
// and one head over key tiles, online softmax, causal (and windowed when a.window > 0).
int attention_prefill(const AttentionArgs& a, cudaStream_t s);
// True when the kernels take this head size (<= 256, a multiple of 32 for Q8_0, even).
bool attention_supported(int head_dim, int kv_dtype);

}  // namespace tandem::cuda

namespace tandem::cuda {
// Reads bytes (a multiple of 16) of buffer once, with blocks blocks: the bandwidth probe.
int read_probe(const void* buffer, size_t bytes, float* sink, int blocks, cudaStream_t s);
}  // namespace tandem::cuda
