// Tensor parallelism at the model/backend seam: which part of every weight a rank owns, and
// the step messages rank 0 sends the others.
//
// With N ranks, rank r owns a contiguous run of query heads and their K,V heads (K,V heads
// divided, unevenly when N does not divide them: SmolLM2's 3 over 2 ranks are 2 + 1 with 6 + 3
// query heads; replicated when n_kv_head < N, as vLLM does), its rows of gate/up, its rows of
// attn_output and ffn_down (n_embd split by output rows), and its rows of the embedding and
// output head. Column-parallel products (Q, K, V, gate, up) read the full normed input every
// rank has; attn_output and ffn_down read the full attention output or gated activation,
// all-gathered from the ranks, and their outputs are all-gathered in turn. So every output
// element is computed on one rank by the same kernel from the same input as in one process:
// the residual stream, every 8-bit activation and the logits are one process's bit for bit
// (an all-reduce of partial sums would add them in another order, and with 8-bit activations
// one ulp can flip a rounding step). The embedding's all-reduce adds zero rows (exact); the
// logits' vocabulary shares are gathered. Its KV pool holds its K,V heads only.
// Rank 0 runs the scheduler, tokenizer, sampler and server; each forward pass it broadcasts
// the ForwardBatch (and which KV pool it runs on), and the other ranks run the same pass.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/collectives.h"
#include "backend/forward_batch.h"
#include "core/error.h"
#include "model/model_config.h"

namespace tandem {

// Shares of n_embd, n_ff and the vocabulary are whole groups of this many rows (the last rank's
// also takes what is left over): the CPU backend packs weights in 16-row groups, so no share
// packs a partial group in the middle of the matrix.
constexpr int64_t kTensorParallelRows = 16;

struct TensorParallelPlan {
  int rank = 0, size = 1;
  int q_head0 = 0, n_q_head = 0;    // this rank's query heads
  int kv_head0 = 0, n_kv_head = 0;  // its K,V heads (the same head on several ranks when replicated)
  bool kv_replicated = false;       // n_kv_head < size: each K,V head lives on size / n_kv_head ranks
  int64_t ff0 = 0, n_ff = 0;        // feed-forward rows (gate, up): its columns of the gated activation
  int64_t embd0 = 0, n_embd = 0;    // attn_output's and ffn_down's rows: its columns of their outputs
  int64_t vocab0 = 0, n_vocab = 0;  // embedding and output rows
  // Every rank's share in rank order, in elements (what each rank adds to a gather): the
  // attention output's columns (query heads x head_dim), n_ff, n_embd, the vocabulary.
  std::vector<int64_t> q_cols, ff_cols, embd_cols, vocab_cols;

  // The whole model on one rank (rank 0 of 1).
  static TensorParallelPlan whole(const ModelConfig& c);
  // Rank `rank` of `size`; an error saying which shape cannot be split `size` ways.
  static Result<TensorParallelPlan> make(const ModelConfig& c, int rank, int size);

  bool split() const { return size > 1; }
  int q_dim(int head_dim) const { return n_q_head * head_dim; }
  int kv_dim(int head_dim) const { return n_kv_head * head_dim; }
};

// The K,V heads a rank of `size` holds: [first, first + count), and whether they are
// replicated; an error when n_kv_head heads neither divide among the ranks nor replicate
// evenly over them. `tandem kv --tensor-parallel` plans with it.
struct KvHeadShare {
  int first = 0, count = 0;
  bool replicated = false;
};
Result<KvHeadShare> kv_head_share(int n_kv_head, int rank, int size);

// One step as rank 0 sends it: run `batch` over KV pool `pool_id` (of that layout; a follower
// allocates it the first time it sees the id), after dropping the pools rank 0 has freed.
struct TensorParallelStep {
  // Heartbeat: nothing to run; rank 0 is alive (sent when no other step went out for a while).
  enum Op : int64_t { Forward = 1, Stop = 2, Heartbeat = 3 };
  int64_t op = Stop;
  int64_t pool_id = 0;
  int64_t n_blocks = 0, block_tokens = 16;
  DType kv_dtype = DType::F16;
  std::vector<int64_t> dropped_pools;
  std::unique_ptr<ForwardBatch> batch;
};

// Rank 0: the step to every other rank (two broadcasts: a fixed header, then the arrays).
void send_step(Collectives& c, int64_t op, int64_t pool_id, const KvStore& kv,
               const std::vector<int64_t>& dropped_pools, const ForwardBatch* batch);
// Rank 0 sends a step at least this often (a heartbeat when idle).
constexpr double kHeartbeatS = 1.0;
// The other ranks: the next step. Rank 0 sends one at least every kHeartbeatS, so waiting
// longer than the collectives' deadline (timeout_s) means it died: an error, never a hang.
Result<TensorParallelStep> receive_step(Collectives& c);

// What one pass of n tokens with n_logits logit rows moves: per layer, the attention output
// [n, q_dim] and gated activation [n, n_ff] gathered before attn_output and ffn_down, and
// their outputs [n, n_embd] after; the embedding's all-reduce of [n, n_embd]; the logits'
// gather [n_logits, n_vocab]. Bytes are what rank p.rank receives (the others' shares).
struct CommunicationCost {
  int64_t collectives = 0;         // per pass: 4 gathers per layer, the all-reduce, the logits' gather
  double per_layer_bytes = 0;      // received per layer (its 4 gathers)
  double gathered_bytes = 0;       // received through the pass's gathers, logits included
  double logits_bytes = 0;         // of which the logits
  double all_reduce_bytes = 0;     // the embedding's buffer
  // Received per pass: every gather's other shares, and 2 (N - 1) / N of the all-reduce's
  // buffer (a ring's share).
  double wire_bytes_per_rank(int ranks) const;
};
CommunicationCost communication_cost(const ModelConfig& c, const TensorParallelPlan& p, int64_t n_tokens,
                                     int64_t n_logits);

}  // namespace tandem
