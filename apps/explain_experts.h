// `explain`'s page on a mixture of experts: the roofline of batched MoE decode. A pass of B
// tokens reads each expert any of them chose once, so the bytes per token fall as B grows,
// from n_used experts per token at B = 1 toward the whole layer shared by all.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/phase_cost.h"
#include "kernels/cpu/probe.h"
#include "model/model.h"

namespace tandem::apps {

struct ExpertRow {
  int64_t batch = 0;
  double expected = 0, measured = 0;  // distinct experts per routed layer in one pass
  double bytes_per_token = 0;          // weight bytes a token's share of the pass reads
  double roof_tok_s = 0;               // the read roof over those bytes, tokens per second for all B
};

// For B = 1, 4, 16, 64: the expected distinct experts (E (1 - (1 - k/E)^B)) beside those a
// pass of B sequences' first tokens (seeded random ids) really routed to. Empty for a dense model.
Result<std::vector<ExpertRow>> expert_rows(Model& model, const ModelShape& shape, const cpu::MachinePeaks& peaks);
std::string experts_text(const std::vector<ExpertRow>& rows, const ModelShape& shape);
nlohmann::ordered_json experts_json(const std::vector<ExpertRow>& rows);

}  // namespace tandem::apps
