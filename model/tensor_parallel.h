// Megatron-style tensor parallelism at the model/backend seam: which part of every weight a
// rank owns, and the step messages rank 0 sends the others.
//
// With N ranks, rank r owns n_head/N query heads and their K,V heads (K,V heads replicated
// when n_kv_head < N, as vLLM does), n_ff/N rows of gate/up, the matching input columns of
// attn_output and ffn_down (each followed by one all-reduce of the [n, n_embd] branch output),
// and n_vocab/N rows of the embedding and output head (embedding rows of other ranks' tokens
// are zero before an all-reduce; logits are all-gathered). Its KV pool holds its K,V heads only.
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

struct TensorParallelPlan {
  int rank = 0, size = 1;
  int q_head0 = 0, n_q_head = 0;    // this rank's query heads
  int kv_head0 = 0, n_kv_head = 0;  // its K,V heads (the same head on several ranks when replicated)
  bool kv_replicated = false;       // n_kv_head < size: each K,V head lives on size / n_kv_head ranks
  int64_t ff0 = 0, n_ff = 0;        // feed-forward rows (gate, up) and ffn_down's columns
  int64_t vocab0 = 0, n_vocab = 0;  // embedding and output rows

  // The whole model on one rank (rank 0 of 1).
  static TensorParallelPlan whole(const ModelConfig& c);
  // Rank `rank` of `size`; an error saying which shape cannot be split `size` ways.
  static Result<TensorParallelPlan> make(const ModelConfig& c, int rank, int size);

  bool split() const { return size > 1; }
  int q_dim(int head_dim) const { return n_q_head * head_dim; }
  int kv_dim(int head_dim) const { return n_kv_head * head_dim; }
};

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

// Bytes one pass moves through all-reduces (2 per layer + the embedding) and the logits gather,
// per rank's buffer, for n tokens and n_logits logit rows: the network's share of a pass.
struct CommunicationCost {
  int64_t all_reduces = 0;          // per pass
  double all_reduce_bytes = 0;      // each rank's buffers, summed over the pass's all-reduces
  double gather_bytes = 0;          // the gathered logits (every rank's share)
  double per_layer_bytes = 0;       // all-reduced per layer
  // What a ring all-reduce sends per rank: 2 (N - 1) / N of each buffer.
  double wire_bytes_per_rank(int ranks) const;
};
CommunicationCost communication_cost(const ModelConfig& c, int ranks, int64_t n_tokens, int64_t n_logits);

}  // namespace tandem
