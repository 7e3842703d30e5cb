// The seam between the forward pass and the hardware: the dozen operations a decoder-only
// transformer's forward pass needs, on tensors and weights the backend owns. model/ writes the
// pass once against this interface; backend/cpu/ runs it on the CPU's kernels and thread team,
// and a CUDA backend fills the same calls with device memory, kernels and a captured graph.
//
// Conventions every op follows:
// - Activations are row-major F32 tensors, one row per token in flight ([n_tokens, width]);
//   an op works on all rows of the tensors (views) it is given.
// - Ops are issued inside run_pass(), on the thread that called it (no backend runs the body
//   on several threads). An op may share its work out (the CPU backend's, over its thread
//   team), and a backend may run the body to record its calls and replay them later (the CUDA
//   backend's graphs). So the body must be a pure sequence of backend calls.
// - Handles (Tensor, Weight) are small values; const on a handle says nothing about whether an
//   op writes its memory: parameters named out* are written.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/collectives.h"
#include "backend/forward_batch.h"
#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

// Memory the backend allocated: rows x cols of dtype, row-major. `data` is the backend's
// address (host or device); the model passes it back to ops and never dereferences it.
struct Tensor {
  void* data = nullptr;
  int64_t rows = 0, cols = 0;
  DType dtype = DType::F32;
  std::shared_ptr<void> owner;  // keeps the allocation alive while any handle holds it

  size_t row_bytes() const;
  // Rows [first, first + n) of the same memory.
  Tensor rows_view(int64_t first, int64_t n) const;
};

// A weight matrix as stored in the model file: rows x cols of type, each row row_bytes long.
struct WeightSource {
  std::string name;  // for error messages
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  bool compute_supported = true;  // the file format says tandem can decode the type
};

// A weight the backend prepared (repacked, uploaded): the shape for cost models, the rest opaque.
struct Weight {
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  uint64_t bytes = 0;                // bytes as stored in the file: what a product streams
  std::shared_ptr<const void> impl;  // the backend's own form
  // The backend still reads the source's bytes (false: it made its own copy, repacked or on
  // the device, so the file's pages of this tensor can be released).
  bool reads_source = true;
};

// One weight applied to an input shared by its group: out [n, w->rows] = in [n, w->cols] W^T
// (+ bias [1, w->rows] on every row when set).
struct Product {
  const Weight* w = nullptr;
  const Tensor* out = nullptr;
  const Tensor* bias = nullptr;
};

// Bytes of one position's K (or V) row of one layer: n_kv_head heads of head_dim elements of
// dtype (F32, F16, Q8_0). Error for another dtype, or a head not a whole number of blocks.
Result<size_t> kv_row_bytes(DType dtype, int n_kv_head, int head_dim);

struct HeadShape {
  int n_head = 0;
  int n_kv_head = 0;  // n_head / n_kv_head query heads share one K,V head (GQA)
  int head_dim = 0;
};

// How RoPE pairs a head's dims. Llama-layout GGUFs (llama, granite) store Wq, Wk permuted for
// adjacent pairs (x[2i], x[2i+1]); Qwen, Gemma and Phi keep the NeoX halves (x[i],
// x[i + rope_dim/2]). Both rotate pair i by the same angle: position * inv_freq[i].
enum class RopeStyle : uint8_t { AdjacentPairs, NeoxHalves };

// The gate's activation in a gated feed-forward, gate = act(gate) * up: SiLU (SwiGLU: Llama,
// Qwen, Phi, Granite), GELU with the tanh approximation (GeGLU: Gemma), or gpt-oss's clamped
// SwiGLU: g = min(g, 7), u = clamp(u, -7, 7), gate = g * sigmoid(1.702 g) * (u + 1).
enum class GateActivation : uint8_t { Silu, GeluTanh, SwigluOai };

// How a mixture-of-experts layer picks and weighs each token's experts from its router logits
// (one per expert). Softmax gating: probabilities over all experts, the n_used largest kept
// (Qwen3-MoE, Mixtral, OLMoE, Qwen2-MoE); with softmax_over_top_k the n_used largest raw
// logits are taken first and the softmax runs over them alone (gpt-oss). normalize: the kept
// weights are divided by their sum; then every weight is multiplied by scale.
enum class ExpertGating : uint8_t { Softmax, Sigmoid };
struct MoeRouting {
  int n_expert = 0;
  int n_used = 0;
  ExpertGating gating = ExpertGating::Softmax;
  bool softmax_over_top_k = false;
  bool normalize = false;
  float scale = 1.0f;
};

// One layer's routed experts: expert e's gate and up [n_ff, cols] and down [cols, n_ff]; and,
// where the family has one, a shared expert every row runs (gate, up, down as a dense FFN's),
// its output scaled by sigmoid(shared_router . x) ([1, cols]).
struct ExpertWeights {
  std::span<const Weight> gate, up, down;
  const Weight* shared_gate = nullptr;
  const Weight* shared_up = nullptr;
  const Weight* shared_down = nullptr;
  const Weight* shared_router = nullptr;
  // Per-expert biases (null: none): [n_expert, n_ff] added after gate and up, [n_expert,
  // cols] after down, before the route's weight (gpt-oss).
  const Tensor* gate_bias = nullptr;
  const Tensor* up_bias = nullptr;
  const Tensor* down_bias = nullptr;
};

// What one layer's attention computes besides the shapes.
struct AttentionParams {
  float scale = 0;     // scores = q . k * scale (usually 1 / sqrt(head_dim); the family decides)
  int64_t window = 0;  // > 0: sliding window, a query at position p sees keys p' with p - p' < window
  // [1, n_head] (null: none): per head, a logit in every softmax's denominator with no value
  // (gpt-oss's attention sinks).
  const Tensor* sinks = nullptr;
};

// The last step from hidden state to logits, after the output head's product.
struct LogitsParams {
  float scale = 1;    // logits *= scale (Granite divides by its logit_scale)
  float softcap = 0;  // > 0: logits = softcap * tanh(logits / softcap)
  // Every row is read only for its largest entry (greedy sampling without penalties or
  // logprobs): a backend may give the other entries approximately, as long as each entry that
  // could be the row's largest holds the exact product's float and every other entry is below
  // it, so the argmax (ties included) is the exact head's. See kernels/cpu/bounded_head.h.
  bool argmax_only = false;
};

// Where K and V of every layer live: n_blocks blocks of block_tokens positions; inside a block,
// layer l's K rows then its V rows ([block_tokens, n_kv_head * head_dim] each, of dtype: F32,
// F16, or Q8_0 with each head's row a whole number of 32-element blocks). The backend
// allocates it (new_kv_store); the host's BlockAllocator decides which block holds what.
struct KvStore {
  uint8_t* data = nullptr;  // the backend's address (host or device)
  DType dtype = DType::F16;
  int n_layer = 0;
  int block_tokens = 0;
  int64_t n_blocks = 0;
  size_t row_bytes = 0;  // one position's K (or V) of one layer
  std::shared_ptr<void> owner;  // keeps the allocation alive while any handle holds it
  uint64_t bytes() const { return (uint64_t)n_blocks * block_bytes(); }
  size_t block_bytes() const { return (size_t)n_layer * 2 * (size_t)block_tokens * row_bytes; }
  size_t k_offset(int layer) const { return (size_t)layer * 2 * (size_t)block_tokens * row_bytes; }
  size_t v_offset(int layer) const { return k_offset(layer) + (size_t)block_tokens * row_bytes; }
};

// A KvStore of that shape with no memory yet, its bytes() checked for overflow: what every
// backend's new_kv_store validates before it allocates.
Result<KvStore> kv_store_layout(DType dtype, int n_layer, int block_tokens, int64_t n_blocks, size_t row_bytes);

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu avx512, 2 threads, 8-bit activations": for logs and reports.
  virtual std::string describe() const = 0;
  // The backend's first failure, sticky (Ok when none). Ops return nothing, so a device fault
  // or a failed library call is kept here (and later ops skipped); Model::forward checks it
  // after every pass, so a failure is an error, never NaN logits. The CPU backend never fails.
  virtual Status error() const { return Status::Ok(); }

  // ---- memory ----
  virtual Tensor new_tensor(int64_t rows, int64_t cols) = 0;  // F32, contents undefined
  virtual Tensor upload(std::span<const float> host, int64_t rows, int64_t cols) = 0;
  // The tensor's floats on the host; valid until the tensor changes.
  virtual std::span<const float> read(const Tensor& t) = 0;

  // ---- KV storage ----
  // n_blocks blocks of the layout KvStore describes; contents undefined. An allocation that
  // does not fit is an error naming the bytes.
  virtual Result<KvStore> new_kv_store(DType dtype, int n_layer, int block_tokens, int64_t n_blocks,
                                       size_t row_bytes) = 0;
  // Whether store_kv and attention read the layer-group views of a batch (ForwardBatch::group,
  // a pool with window-only blocks). The CUDA backend stages one batch per pass: not yet.
  virtual bool kv_layer_groups() const { return false; }

  // ---- weights ----
  // products: the weight multiplies activations (false: only embed() looks rows up).
  virtual Result<Weight> prepare_weight(const WeightSource& src, bool products) = 0;
  // A norm's or bias's vector, decoded to F32: [1, src.cols].
  virtual Result<Tensor> prepare_vector(const WeightSource& src) = 0;

  // ---- the pass ----
  // Runs body as one forward pass over n_tokens tokens. The CPU backend runs it once, on the
  // calling thread, whatever n_tokens, with its thread team (cpu::WorkTeam) as that thread's
  // for the pass: each op shares its items out over the team, or runs inline when it has too
  // few. A CUDA backend captures decode-sized passes as graphs and replays them.
  virtual void run_pass(int64_t n_tokens, const std::function<void()>& body) = 0;

  // out [n_tokens, cols] = rows of `table` for the batch's tokens, times scale (Gemma and
  // Granite scale their embeddings).
  virtual void embed(const Weight& table, const ForwardBatch& b, const Tensor& out, float scale) = 0;
  // Every product of the group reads the same input [n, cols]: it is prepared once.
  virtual void matmul(std::span<const Product> group, const Tensor& in) = 0;
  // out = x / rms(x) * weight over each row, or with head_dim > 0 over each head_dim-wide
  // head of each row (QK-norm; weight is then [1, head_dim]). out may be x (in place).
  virtual void rmsnorm(const Tensor& x, const Tensor& weight, const Tensor& out, float eps, int head_dim = 0) = 0;
  // x += delta * delta_scale (the residual add; Granite scales its branches), then out =
  // rmsnorm(x) * norm when norm is set (the next sub-block's input, fused so x is read once).
  virtual void add_residual(const Tensor& x, const Tensor& delta, const Tensor* norm, const Tensor* out, float eps,
                            float delta_scale) = 0;
  // out [n_tokens, rope_dim] = cos, sin pairs of each token's position times inv_freq: once
  // per pass, shared by every layer and head.
  virtual void rope_angles(const ForwardBatch& b, std::span<const double> inv_freq, int rope_dim,
                           const Tensor& out) = 0;
  // Rotates the pairs (of `style`) of the first rope_dim dims of every head of q and k.
  virtual void rope(const Tensor& q, const Tensor& k, const Tensor& angles, const HeadShape& h, int rope_dim,
                    RopeStyle style) = 0;
  // gate = act(gate) * up: the gated feed-forward's activation.
  virtual void gated_activation(const Tensor& gate, const Tensor& up, GateActivation act) = 0;
  // Writes each token's K and V rows of one layer at the batch's slots, rounded to kv.dtype.
  virtual void store_kv(const Tensor& k, const Tensor& v, const KvStore& kv, int layer, const ForwardBatch& b) = 0;
  // Causal attention of each token's query over its sequence's keys [0, position] (the last
  // p.window of them with a sliding window), scores scaled by p.scale:
  // out [n_tokens, n_head * head_dim].
  virtual void attention(const Tensor& q, const KvStore& kv, int layer, const ForwardBatch& b, const HeadShape& h,
                         const AttentionParams& p, const Tensor& out) = 0;
  // Wall time spent in attention() so far, in seconds; -1 where the backend does not measure it
  // (a GPU's kernels run asynchronously). `bench` and `explain` split a phase's time by it.
  virtual double attention_seconds() const { return -1; }
  // ---- mixtures of experts (a backend that runs them says so; others refuse such models) ----
  virtual bool runs_moe() const { return false; }
  // moe_ffn calls so far, and the distinct experts they ran (all calls together): `explain`
  // measures how many experts a batch reads.
  struct MoeCounts {
    int64_t calls = 0, experts = 0;
  };
  virtual MoeCounts moe_counts() const { return {}; }
  // routes [n, 2 * r.n_used] = for each row of router logits [n, r.n_expert]: the chosen
  // experts' ids (as floats, largest weight first, ties to the lower id), then their weights.
  virtual void moe_route(const Tensor& router_logits, const MoeRouting& r, const Tensor& routes);
  // out [n, x.cols] = for each row, the sum over its routes of weight * down_e(act(gate_e x)
  // * up_e x), plus the shared expert's output when e has one. Each chosen expert's weights
  // are read once per call, however many rows chose it.
  virtual void moe_ffn(const Tensor& x, const Tensor& routes, int n_used, const ExpertWeights& e, GateActivation act,
                       const Tensor& out);

  // out [rows.size(), w.rows] = W rmsnorm(x[rows[i]]) * norm, then p's scale and soft-cap: the
  // logits of the rows that want them. scratch: at least [rows.size(), x.cols].
  virtual void logits(const Tensor& x, std::span<const int64_t> rows, const Tensor& norm, float eps, const Weight& w,
                      const Tensor& scratch, const Tensor& out, const LogitsParams& p) = 0;

  // ---- tensor parallelism (model/tensor_parallel.h) ----
  // Whether the ops below run here (false: a model is refused a tensor-parallel load).
  virtual bool runs_tensor_parallel() const { return false; }
  // embed() over a vocabulary shard: `table` holds rows [first_row, first_row + table.rows);
  // a token outside them gets a zero row (the all-reduce after it adds its owner's row).
  virtual void embed_shard(const Weight& table, int64_t first_row, const ForwardBatch& b, const Tensor& out,
                           float scale);
  // t = the sum over the ranks of t, inside a pass (called once, on the pass's thread).
  virtual void all_reduce(const Tensor& t, Collectives& c);
  // out [n, cols[0] + ... + cols[N - 1]] = every rank's part [n, cols[r]] side by side in rank
  // order (rank r's columns after those of ranks 0..r-1), on every rank, inside a pass.
  virtual void gather_columns(const Tensor& part, const Tensor& out, std::span<const int64_t> cols, Collectives& c);
};

// The backend a model gets when its caller names none: the CPU at its best ISA, every core.
std::shared_ptr<Backend> default_backend();

}  // namespace tandem
