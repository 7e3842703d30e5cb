// Picks the next token from logits: greedy, or a chain of repetition penalty -> top-k ->
// top-p -> min-p -> temperature -> seeded random draw (the order llama.cpp uses).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace tandem {

// One token's probability in a distribution (only tokens with p > 0 are listed).
struct TokenProb {
  int32_t id;
  float p;
};

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

  // history: tokens so far (prompt and generated), for the repetition penalty. allowed: a
  // token mask (bit t of word t/64 set <=> token t may come next; constrained decoding, see
  // engine/grammar/); empty: every token. The chain runs over the allowed tokens only, so the
  // result is the unconstrained chain's distribution restricted to them and renormalized.
  // A mask with no token set draws from the whole vocabulary (the caller ends such a sequence).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, std::span<const uint64_t> allowed = {});

  // Greedy without a repetition penalty: the argmax of the logits as they are, without copying
  // them into candidates (decode and every drafted position pay for a copy of the vocabulary);
  // the scheduler then asks the backend for rows whose argmax alone is exact.
  bool plain_greedy() const { return p_.temperature <= 0.0f && p_.repeat_penalty == 1.0f; }

  // Speculative verification of a drafted token (a point-mass proposal): accepted with the
  // probability p(draft) of this sampler's distribution (after penalty, top-k/p, min-p and
  // temperature); otherwise the token is drawn from that distribution with `draft` removed and
  // the rest renormalized. Accepted or not, the token returned is distributed exactly as
  // sample()'s would be. Greedy: accepted iff the draft is the argmax, which is returned.
  struct Verdict {
    int32_t token;
    bool accepted;
  };
  // `allowed` as for sample(): a draft outside the mask has probability 0 and is rejected.
  Verdict verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft,
                 std::span<const uint64_t> allowed = {});

  // A draft model's side: draws a token from this sampler's distribution over `logits` (the
  // draft model's) and leaves that distribution, q, in `q`. Greedy: the argmax, q = {argmax: 1}.
  int32_t propose(std::span<const float> logits, std::span<const int32_t> history, std::vector<TokenProb>& q);
  // Speculative verification of a token drawn from the proposal distribution q (the standard
  // rule): accepted with probability min(1, p(draft) / q(draft)), p this sampler's
  // distribution; otherwise a token is drawn from max(0, p - q), renormalized. The token
  // returned is distributed as sample()'s would be, whatever q is. Greedy: accepted iff the
  // draft is p's argmax, which is returned. `allowed` as for sample(): p is the constrained
  // distribution (a draft outside the mask has p = 0 and is rejected, the residual drawn from
  // the allowed tokens), so the output stays exactly sample()'s.
  Verdict verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft,
                 std::span<const TokenProb> q, std::span<const uint64_t> allowed = {});

  static int32_t argmax(std::span<const float> logits);

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  void apply_repeat_penalty(std::span<const int32_t> history);
  void softmax();
  // Leaves the final distribution in cand_ (greedy: the argmax alone, p = 1).
  void build_distribution(std::span<const float> logits, std::span<const int32_t> history, std::span<const uint64_t> allowed);
  double uniform();  // [0, 1), from the raw 64-bit output: the same on every standard library

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<Candidate> cand_;  // reused across calls
  std::vector<float> q_dense_;   // verify with q: q by token id (zero outside q), reused
};

}  // namespace tandem
