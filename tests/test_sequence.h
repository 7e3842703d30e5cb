// One sequence over a KV pool of its own, for the tests that drive the forward pass directly
// (prefill a prompt, decode token by token, recompute from scratch) rather than through the
// scheduler: the same paged pool every command uses, sized for `tokens` positions.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <vector>

#include "engine/sequence_runner.h"
#include "kv/block_pool.h"
#include "model/model.h"

namespace tandem::test {

class OneSequence {
 public:
  OneSequence(Model& m, int64_t tokens, DType dtype = DType::F16, int64_t max_chunk = 512, int block_tokens = 16) {
    auto p = m.new_kv_pool((tokens + block_tokens - 1) / block_tokens, dtype, block_tokens);
    EXPECT_TRUE(p.ok()) << p.error().message;
    if (!p.ok()) return;
    pool_ = std::move(p.value());
    runner_ = std::make_unique<SequenceRunner>(m, *pool_, max_chunk);
  }
  // Tokens at the next positions; the logits of the last (or, with all, every) position.
  Result<std::span<const float>> prefill(std::span<const int32_t> tokens, bool all = false) {
    return runner_->run(tokens, all);
  }
  Result<std::span<const float>> decode(int32_t token) { return runner_->run(std::span<const int32_t>(&token, 1)); }
  int64_t size() const { return runner_->size(); }
  const BlockPool& pool() const { return *pool_; }

 private:
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<SequenceRunner> runner_;
};

// The naive mode's logits: the last position's, with K,V of every position computed afresh.
inline std::vector<float> no_cache_logits(Model& m, std::span<const int32_t> tokens, DType dtype = DType::F16) {
  OneSequence s(m, (int64_t)tokens.size(), dtype);
  auto r = s.prefill(tokens);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::vector<float>(r->begin(), r->end()) : std::vector<float>{};
}

}  // namespace tandem::test
