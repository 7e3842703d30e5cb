// Timed forward passes for `tandem bench`: a prefill of n tokens into a fresh cache (pp), n
// decode steps from an empty cache (tg, as llama-bench measures it), and the sweeps behind
// the --sweep plots. Token ids are a fixed pseudo-random sequence: speed does not depend on
// which tokens run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/speculative.h"
#include "model/model.h"

namespace tandem::apps {

std::vector<int32_t> bench_tokens(int64_t n, int n_vocab, uint64_t salt = 0);
// A timed run: its seconds, and of them the seconds in attention (-1: the backend does not say).
struct TimedRun {
  double seconds = 0, attention_s = -1;
};
// One prefill of n tokens at positions [depth, depth + n): a context of `depth` tokens is
// prefilled first, untimed (llama-bench's -d).
Result<TimedRun> time_prefill(Model& m, int64_t n, DType kv_dtype, int64_t depth = 0);
// n decode steps starting at position `depth` (after an untimed prefill of that many tokens):
// each step then reads depth + i cached positions besides the weights.
Result<TimedRun> time_decode(Model& m, int64_t n, DType kv_dtype, int64_t depth = 0);

// `tandem bench --speculative`: decode tok/s of greedy generation after `prompt` (n tokens,
// end of generation ignored), plain and with `spec`, alternately, `reps` times each.
struct SpecResult {
  std::vector<double> plain_tok_s, spec_tok_s;
  int64_t drafted = 0, accepted = 0;  // over the speculative runs
};
Result<SpecResult> time_speculative(Model& m, Model* draft, const std::vector<int32_t>& prompt, int64_t n, int reps,
                                    const SpeculativeParams& spec, DType kv_dtype);
std::string default_spec_prompt();  // a paragraph and the request to repeat it with one change

struct ContextPoint {
  int64_t context = 0;
  double ttft_s = 0;  // prefill of `context` tokens
  double tpot_s = 0;  // mean of the decode steps right after it
};
// For each length: prefill it, then decode `decode_steps` tokens on top.
Result<std::vector<ContextPoint>> sweep_context(Model& m, const std::vector<int64_t>& lengths, int decode_steps,
                                                DType kv_dtype);

struct GenerationPoint {
  int64_t n = 0;           // tokens generated after a one-token prompt
  double cached_s = 0;     // prefill 1 + n - 1 decode steps
  double no_cache_s = 0;   // n forward passes over the whole sequence so far
};
Result<std::vector<GenerationPoint>> sweep_cache_vs_naive(Model& m, const std::vector<int64_t>& ns, DType kv_dtype);

// Least-squares slope of log(y) over log(x): the exponent k of y ~ x^k.
double fitted_exponent(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace tandem::apps
