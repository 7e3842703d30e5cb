#include "engine/draft_model.h"

#include <algorithm>

namespace tandem {

Status check_draft_vocabulary(const Model& target, const Model& draft) {
  const int64_t vt = target.config().n_vocab, vd = draft.config().n_vocab;
  if (vt != vd) return make_error("the draft model has {} logits per token; the target has {} (the vocabularies differ)", vd, vt);
  const GgufArray* tt = target.gguf().get_array("tokenizer.ggml.tokens");
  const GgufArray* td = draft.gguf().get_array("tokenizer.ggml.tokens");
  if (!tt || !td) return make_error("the {} model has no tokenizer.ggml.tokens: its vocabulary cannot be compared", tt ? "draft" : "target");
  if (tt->strings.size() != td->strings.size())
    return make_error("the draft model's vocabulary has {} tokens; the target's has {}", td->strings.size(), tt->strings.size());
  for (size_t i = 0; i < tt->strings.size(); i++)
    if (tt->strings[i] != td->strings[i])
      return make_error("the draft model's token {} is '{}'; the target's is '{}' (the vocabularies differ)", i,
                        std::string(td->strings[i]), std::string(tt->strings[i]));
  return Status::Ok();
}

Result<std::unique_ptr<BlockPool>> new_draft_pool(const Model& draft, const BlockPool& target_pool) {
  // As many positions as the target's pool would hold as a full store: with window-only
  // blocks, the target's blocks hold a group of its layers each.
  const int64_t blocks = std::max<int64_t>(
      1, target_pool.n_blocks() * target_pool.groups().group_layers / std::max(1, target_pool.shape().n_layer));
  return draft.new_kv_pool(blocks, target_pool.shape().dtype, target_pool.block_tokens());
}

}  // namespace tandem
