// A loaded model of any family tandem runs (its ArchSpec: model/arch_spec.h) and its one
// forward pass (Model::pass), run as calls to the
// backend (backend/) over a ForwardBatch: the tokens of one or many sequences at their
// positions, whose K,V live in a paged KV pool (kv/block_pool.h). Both phases of inference are
// this one pass: prefill puts a prompt's tokens in one batch (matrix-matrix products, compute
// bound), decode one token per sequence (matrix-vector, bound by reading every weight); the
// naive no-cache mode recomputes every earlier position in each pass. Who runs which tokens
// when is the scheduler's (engine/).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/forward_batch.h"
#include "core/error.h"
#include "gguf/gguf_file.h"
#include "kv/block_allocator.h"
#include "kv/layer_groups.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "model/tensor_parallel.h"

namespace tandem {

struct ModelOptions {
  std::shared_ptr<Backend> backend;  // null: default_backend() (the CPU, every core)
  std::function<void(int, int)> on_load_progress;  // (layers prepared, layers), while loading
  // The ranks of a tensor-parallel job (null or one rank: the whole model in this process).
  // Each rank loads its shard; rank 0 calls forward(), the others follow() (tensor_parallel.h).
  std::shared_ptr<Collectives> tensor_parallel;
};

class BlockPool;
struct BlockPoolShape;

// One token of a serving step: which sequence it belongs to, its position, whether its
// logits are wanted (the last prompt token, or a decode token).
struct BatchEntry {
  int32_t token = 0;
  int64_t pos = 0;
  int seq = 0;
  bool logits = false;
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& path, const ModelOptions& opts = {});
  static Result<std::unique_ptr<Model>> from_gguf(std::unique_ptr<GgufFile> file, const ModelOptions& opts = {});

  ~Model();

  const ModelConfig& config() const { return config_; }
  // This rank's share of the heads, feed-forward and vocabulary (the whole model on one rank).
  const TensorParallelPlan& shard() const { return tp_; }
  // The job's collectives, or null in a process of its own.
  Collectives* collectives() const { return tp_.split() ? comm_.get() : nullptr; }
  const ModelWeights& weights() const { return weights_; }
  const GgufFile& gguf() const { return *file_; }
  Backend& backend() const { return *backend_; }

  // The shape of a KV pool of n_blocks blocks for this model. window_only: its sliding-window
  // layers keep only their window (kv/layer_groups.h), where the backend supports layer groups
  // (the CPU's; on another backend the pool keeps the full store).
  BlockPoolShape kv_pool_shape(int64_t n_blocks, DType dtype, int block_tokens, bool window_only) const;
  // A KV pool of n_blocks blocks of block_tokens positions in this model's shape, in its
  // backend's memory. hash: the prefix cache's (tests only; empty: keyed SipHash-2-4).
  Result<std::unique_ptr<BlockPool>> new_kv_pool(int64_t n_blocks, DType dtype = DType::F16, int block_tokens = 16,
                                                 PrefixHashFn hash = {}) const;

  // One forward pass over the batch's tokens (of one or several sequences: every weight
  // matrix multiplies all of them at once); their K,V go to the pool's blocks at the batch's
  // slots. Returns [n_logits, n_vocab]: one row per logit row of the batch, in order; the span
  // lives until the next call.
  Result<std::span<const float>> forward(BlockPool& pool, const ForwardBatch& batch);
  // The same pass, for an embedding model: returns [n_tokens, n_embd], every token's final
  // hidden state after the output norm (what its logits would be computed from); the span
  // lives until the next call. Not under tensor parallelism.
  Result<std::span<const float>> hidden_states(BlockPool& pool, const ForwardBatch& batch);
  // The same from entries and per-sequence block tables (entry.seq indexes `tables`).
  Result<std::span<const float>> forward_batch(BlockPool& pool, std::span<const BatchEntry> batch,
                                               std::span<const std::vector<int32_t>> tables);

  // A rank other than 0 of a tensor-parallel job: runs every pass rank 0 sends, on KV stores of
  // its own heads, until rank 0's model is destroyed (Ok) or a peer fails (the error).
  Status follow();

 private:
  Model() = default;
  Status check_tokens(std::span<const int32_t> tokens) const;
  void ensure_scratch(int64_t n_tokens, int64_t n_logit_rows);
  // The one forward pass: embed the batch's tokens, run every layer (K,V in `kv`), and
  // write the logits of its logit rows to rows [logits_at, ...) of logits_.
  // `groups`: which layers a block of `kv` holds (kv/layer_groups.h; one group of all layers
  // for a full store).
  // `hidden`: after the last layer, the output norm of every row into xb_ (hidden_states).
  void pass(const KvStore& kv, const KvLayerGroups& groups, const ForwardBatch& b, int64_t logits_at, bool hidden = false);
  Status check_batch(BlockPool& pool, const ForwardBatch& b) const;
  // Parts of pass(), each a sequence of backend calls.
  void embed_tokens(const ForwardBatch& b, const Tensor& x);
  void routed_ffn(const LayerWeights& L, const Tensor& xb, const Tensor& proj);
  // Tensor parallel: the pass on every rank, then every rank's vocabulary share of the logits
  // gathered into full rows (gathered_); an error when a peer failed. Full stores only.
  Result<std::span<const float>> parallel_pass(const KvStore& kv, const ForwardBatch& b);
  // Rank 0: the id of the pool a pass runs on, and the ids of pools freed since the last step.
  int64_t pool_id(const KvStore& kv, std::vector<int64_t>& dropped);

  std::unique_ptr<GgufFile> file_;
  std::shared_ptr<Backend> backend_;
  ModelConfig config_;
  ModelWeights weights_;
  ModelOptions opts_;
  std::vector<std::vector<double>> inv_freq_;  // per RoPE set: [rope_dim / 2] angle per position, per pair

  // Activations of the tokens in flight (backend memory), grown on demand and reused.
  int64_t scratch_tokens_ = 0;
  Tensor x_;        // [n, n_embd] residual stream
  Tensor xb_;       // [n, n_embd] normed input of a sub-block
  Tensor q_;        // [n, q_dim]
  Tensor k_;        // [n, kv_dim]
  Tensor v_;        // [n, kv_dim]
  Tensor att_;      // [n, q_dim] attention output (of this rank's heads)
  Tensor proj_;     // [n, n_embd] output of attn_output / ffn_down
  Tensor gate_;     // [n, n_ff] (this rank's rows of gate and up)
  Tensor up_;       // [n, n_ff]
  Tensor router_;   // [n, n_expert] a routed layer's router logits
  Tensor routes_;   // [n, 2 * n_used] each token's experts and their weights (Backend::moe_route)
  // Tensor parallel only: every rank's att_ and gate_ columns gathered, and this rank's rows of
  // the attn_output / ffn_down output before they are gathered into proj_.
  Tensor att_all_;    // [n, q_dim] of the whole model
  Tensor gate_all_;   // [n, n_ff] of the whole model
  Tensor proj_part_;  // [n, this rank's n_embd share]
  std::vector<Tensor> rope_cs_;  // per RoPE set: [n, rope_dim] each position's cos, sin pairs
  Tensor logits_;   // [n_logit_rows, n_vocab] (this rank's vocabulary share)

  TensorParallelPlan tp_;
  std::shared_ptr<Collectives> comm_;
  std::vector<float> gathered_;  // rank 0 of a job: [n_logit_rows, n_vocab], the ranks' shares joined
  // Rank 0: the pools the other ranks mirror (alive while their storage is), by id.
  std::vector<std::pair<int64_t, std::weak_ptr<void>>> pools_;
  int64_t next_pool_id_ = 1;
  // Rank 0: a heartbeat step goes out whenever no step did for kHeartbeatS, so the other ranks,
  // which wait for each step with a deadline, notice a rank 0 that died (MPI itself never tells
  // them). Steps go out one at a time under the collectives' step_mu (a pass holds it whole).
  void start_heartbeat();
  void stop_heartbeat();
  std::condition_variable_any heartbeat_cv_;
  bool heartbeat_stop_ = false;
  std::chrono::steady_clock::time_point last_step_;
  std::thread heartbeat_;
};

}  // namespace tandem
