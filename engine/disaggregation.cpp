#include "engine/disaggregation.h"

#include <cstdio>

#include <fmt/core.h>

namespace tandem {

DisaggregateSplit parse_disaggregate(const std::string& spec, int n_ranks) {
  DisaggregateSplit s;
  int used = 0;
  if (std::sscanf(spec.c_str(), "%d:%d%n", &s.n_prefill, &s.n_decode, &used) != 2 || used != (int)spec.size() ||
      s.n_prefill < 1 || s.n_decode < 1)
    return {0, 0, fmt::format("--disaggregate {}: give P:D, the prefill and decode ranks, each at least 1 (e.g. 1:1)", spec)};
  if (s.n_prefill + s.n_decode != n_ranks)
    return {0, 0, fmt::format("--disaggregate {}: {} + {} ranks, but this job has {}; start it as mpirun -np {} tandem serve ...",
                              spec, s.n_prefill, s.n_decode, n_ranks, s.n_prefill + s.n_decode)};
  if (s.n_decode != 1)
    return {0, 0, fmt::format("--disaggregate {}: one decode rank for now (rank 0, beside the router); more decode "
                              "ranks would need the router to forward tokens from them (not yet): use {}:1",
                              spec, n_ranks - 1)};
  return s;
}

HandoffCost handoff_cost(double kv_bytes_per_position, int64_t n_prompt, int block_tokens) {
  HandoffCost c;
  c.blocks = (n_prompt + block_tokens - 1) / block_tokens;
  c.bytes = (double)(c.blocks * block_tokens) * kv_bytes_per_position;
  return c;
}

}  // namespace tandem
