// Picks the next token from logits: greedy, or a chain of repetition penalty -> top-k ->
// top-p -> min-p -> temperature -> seeded random draw (the order llama.cpp uses).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 0.8f;     // <= 0 means greedy (argmax)
  int top_k = 40;               // <= 0 disables
  float top_p = 0.95f;          // >= 1 disables
  float min_p = 0.05f;          // <= 0 disables
  float repeat_penalty = 1.0f;  // 1 disables; > 1 discourages tokens seen in the last repeat_last_n
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

  // history: tokens so far (prompt and generated), for the repetition penalty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  static int32_t argmax(std::span<const float> logits);

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  void apply_repeat_penalty(std::span<const int32_t> history);
  void softmax();

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<Candidate> cand_;  // reused across calls
};

}  // namespace tandem
