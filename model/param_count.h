// A model's parameters as a user reads them: all of them, and for a mixture of experts the
// active ones, those a token runs (every dense weight and n_used of each routed layer's
// n_expert experts), with their bytes: what decode reads per token.
#pragma once

#include <cstdint>

#include "gguf/gguf_file.h"
#include "model/arch_spec.h"

namespace tandem {

struct ParamCount {
  uint64_t total = 0, total_bytes = 0;
  uint64_t experts = 0, expert_bytes = 0;  // of the routed experts' tensors (ffn_*_exps)
  uint64_t lookup_bytes = 0;  // an untied token embedding: a decode token reads one row of it
  double active(const MoeSpec& m) const { return total - experts * (1.0 - share(m)); }
  // The bytes a decode token reads: the active weights but the embedding table's other rows.
  double active_bytes(const MoeSpec& m) const { return total_bytes - lookup_bytes - expert_bytes * (1.0 - share(m)); }
  static double share(const MoeSpec& m) {
    return m.active() ? (double)m.routing.n_used / (double)m.routing.n_expert : 1.0;
  }
};

ParamCount count_params(const GgufFile& f);

}  // namespace tandem
