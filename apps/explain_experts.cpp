#include "apps/explain_experts.h"

#include <random>

#include <fmt/format.h>

#include "core/units.h"
#include "kv/block_pool.h"

namespace tandem::apps {

namespace {

// The mean distinct experts per routed layer of one pass over B sequences' first tokens.
Result<double> measure(Model& model, int64_t B) {
  auto pool = model.new_kv_pool(B, DType::F16, 16);
  if (!pool.ok()) return pool.error();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> token(0, model.config().n_vocab - 1);
  std::vector<BatchEntry> batch;
  std::vector<std::vector<int32_t>> tables;
  for (int64_t i = 0; i < B; i++) {
    batch.push_back({token(rng), 0, (int)i, i + 1 == B});
    tables.push_back({(int32_t)i});
  }
  const Backend::MoeCounts before = model.backend().moe_counts();
  auto logits = model.forward_batch(*pool.value(), batch, tables);
  if (!logits.ok()) return logits.error();
  const Backend::MoeCounts after = model.backend().moe_counts();
  const int64_t calls = after.calls - before.calls;
  return calls > 0 ? (double)(after.experts - before.experts) / (double)calls : 0.0;
}

}  // namespace

Result<std::vector<ExpertRow>> expert_rows(Model& model, const ModelShape& shape, const cpu::MachinePeaks& peaks) {
  std::vector<ExpertRow> rows;
  if (shape.n_expert == 0) return rows;
  for (int64_t B : {1, 4, 16, 64}) {
    ExpertRow r;
    r.batch = B;
    r.expected = shape.expected_experts(B);
    auto m = measure(model, B);
    if (!m.ok()) return m.error();
    r.measured = m.value();
    r.bytes_per_token = shape.weight_bytes_for(B) / (double)B;
    r.roof_tok_s = peaks.read_bytes_per_s / r.bytes_per_token;
    rows.push_back(r);
  }
  return rows;
}

std::string experts_text(const std::vector<ExpertRow>& rows, const ModelShape& shape) {
  if (rows.empty()) return "";
  std::string s = fmt::format(
      "\nExperts: each routed layer has {} and a token runs {}. A pass of B tokens (B streams decoding together)\n"
      "reads every expert any of them chose once, so the weight bytes per token fall as B grows (expected:\n"
      "E (1 - (1 - k/E)^B) distinct experts; measured: a pass over B sequences' first tokens):\n\n"
      "| B | experts read per layer, expected | measured | weight bytes per token | read roof, tok/s for all B |\n"
      "| ---: | ---: | ---: | ---: | ---: |\n",
      shape.n_expert, shape.n_used);
  for (const ExpertRow& r : rows)
    s += fmt::format("| {} | {:.1f} | {:.1f} | {} | {:.0f} |\n", r.batch, r.expected, r.measured, format_bytes(r.bytes_per_token),
                     r.roof_tok_s);
  return s;
}

nlohmann::ordered_json experts_json(const std::vector<ExpertRow>& rows) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const ExpertRow& r : rows)
    j.push_back({{"batch", r.batch},
                 {"experts_expected", r.expected},
                 {"experts_measured", r.measured},
                 {"weight_bytes_per_token", r.bytes_per_token},
                 {"read_roof_tok_s", r.roof_tok_s}});
  return j;
}

}  // namespace tandem::apps
