#include "engine/disaggregation.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <string_view>

#include <fmt/core.h>

namespace tandem {

namespace {

// A count of ranks: decimal digits only (no sign, no space), at least 1; nullopt otherwise.
std::optional<int> rank_count(std::string_view s) {
  int v = 0;
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 1) return std::nullopt;
  return v;
}

}  // namespace

DisaggregateSplit parse_disaggregate(const std::string& spec, int n_ranks) {
  const size_t colon = spec.find(':');
  const std::optional<int> p = colon == std::string::npos ? std::nullopt : rank_count(std::string_view(spec).substr(0, colon));
  const std::optional<int> d = colon == std::string::npos ? std::nullopt : rank_count(std::string_view(spec).substr(colon + 1));
  if (!p || !d)
    return {0, 0, fmt::format("--disaggregate '{}': give P:D, the prefill and decode ranks, each a whole number of at least 1 "
                              "(e.g. 1:1)", spec)};
  DisaggregateSplit s{*p, *d, ""};
  if ((int64_t)s.n_prefill + s.n_decode != n_ranks)
    return {0, 0, fmt::format("--disaggregate {}: {} + {} ranks, but this job has {}; start it as mpirun -np {} tandem serve ...",
                              spec, s.n_prefill, s.n_decode, n_ranks, (int64_t)s.n_prefill + s.n_decode)};
  return s;
}

HandoffCost handoff_cost(double kv_bytes_per_position, int64_t n_prompt, int block_tokens) {
  HandoffCost c;
  c.blocks = (n_prompt + block_tokens - 1) / block_tokens;
  c.bytes = (double)(c.blocks * block_tokens) * kv_bytes_per_position;
  return c;
}

}  // namespace tandem
