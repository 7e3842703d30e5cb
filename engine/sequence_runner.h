// One sequence's tokens through the model, pass by pass, over blocks of a paged KV pool: what
// `tandem bench` (timing one phase alone), `tandem logits` (every position's logits) and the
// tests drive directly. No sampling, no scheduling: generation runs through the Scheduler
// (engine/generator.h for one request). The KV lives where every command's does, in the pool;
// this holds the sequence's block table and how many positions are filled.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "model/model.h"

namespace tandem {

class SequenceRunner {
 public:
  // max_chunk: longer runs go as several passes of at most this many tokens (chunked prefill).
  SequenceRunner(Model& model, BlockPool& pool, int64_t max_chunk = 512);
  SequenceRunner(const SequenceRunner&) = delete;
  SequenceRunner& operator=(const SequenceRunner&) = delete;

  // Runs tokens at positions [size(), size() + n), writing their K,V, and returns the logits
  // of the last position ([n_vocab]) or, with all_logits, of every one ([n, n_vocab]). The
  // span lives until the next call. Error when the pool has no free blocks left.
  Result<std::span<const float>> run(std::span<const int32_t> tokens, bool all_logits = false);
  int64_t size() const { return n_; }  // positions filled
  // Forgets positions from n on (their blocks return to the pool), or all of them.
  void truncate(int64_t n);
  void clear() { truncate(0); }

 private:
  Model& model_;
  BlockPool& pool_;
  int64_t max_chunk_;
  int64_t n_ = 0;
  BlockTable kv_;  // its blocks in the pool
  std::vector<float> all_;  // every position's logits when a run spans several passes
};

}  // namespace tandem
