// Speculative decoding with a draft model: a smaller model of the same vocabulary proposes k
// tokens by k cheap decode passes (its weights are a fraction of the target's bytes), and the
// target verifies all of them in its one pass. The scheduler drives both (engine/scheduler.h);
// this file holds what pairs them: the vocabulary check and the draft model's KV pool.
#pragma once

#include <memory>

#include "core/error.h"
#include "kv/block_pool.h"
#include "model/model.h"

namespace tandem {

// The draft model and the pool its K,V live in. Its own BlockPool, not the target's: a block
// holds every layer's K,V in one model's shape (layers x kv heads x head dim), and the two
// models' shapes differ, so one pool's blocks cannot hold the other's. The design is the
// same (paged blocks, per-sequence block tables, rolled back by returning blocks).
struct DraftModel {
  Model* model = nullptr;
  BlockPool* pool = nullptr;
  explicit operator bool() const { return model && pool; }
};

// Ok when `draft` can propose tokens for `target`: the same number of logits and the same
// tokens, text for text (a token id must mean the same piece of text to both). The error
// names the first difference.
Status check_draft_vocabulary(const Model& target, const Model& draft);

// A pool for the draft model with as many positions as `target_pool` would hold as a full
// store (its block size and element type): a sequence's draft K,V do not outgrow what the
// target holds for it. (With window-only blocks the target may hold more; draft blocks only
// come from free ones, so the draft model then drafts less, never wrongly.)
Result<std::unique_ptr<BlockPool>> new_draft_pool(const Model& draft, const BlockPool& target_pool);

}  // namespace tandem
