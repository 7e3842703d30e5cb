// Speculative decoding's one owner. Each sequence holds a Speculation (its draft, its back-off,
// and with a draft model that model's own K,V and sampler); the Speculator proposes drafts
// (prompt lookup, or the draft model's batched passes), walks the target's verdicts over a
// verified draft, and rolls back what was rejected. It sees a sequence through a view (its
// tokens, its target block table, callbacks for sampling and reporting), so it runs and is
// tested without a scheduler; the scheduler plans each step and calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "core/error.h"
#include "engine/draft_model.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "kv/block_table.h"
#include "model/model.h"

namespace tandem {

// One sequence's speculative state.
struct Speculation {
  SpeculativeParams params;  // mode Off: never drafts
  DraftBackoff backoff;
  std::vector<int32_t> draft;  // this step's proposal after the sequence's last token
  // Draft model only: the distribution each draft token was drawn from, the draft model's own
  // block table and how many of the sequence's tokens its K,V hold, and the sampler it draws
  // with (its own random stream: the draws and the acceptance tests must be independent).
  std::vector<std::vector<TokenProb>> draft_q;
  BlockTable draft_kv;  // in the draft model's pool
  int64_t draft_computed = 0;
  Sampler draft_sampler;

  Speculation(const SpeculativeParams& p, const SamplingParams& sampling);
  void clear_draft() { draft.clear(), draft_q.clear(); }
  void release() { draft_kv.release(), draft_computed = 0; }  // preempted or finished
};

struct SpeculationStats {
  // Tokens proposed, proposed tokens the target accepted, and the decode steps that verified
  // a draft.
  int64_t drafted_tokens = 0, accepted_tokens = 0, verify_steps = 0;
  int64_t draft_passes = 0;  // the draft model's forward passes (batched across sequences)
  double draft_pass_s = 0;   // time in them (part of the steps' time, not of pass_s)
  // Of those, the passes over prompts (prefilled beside the target's prefill: time to first
  // token, not decode) and their time.
  int64_t draft_prefill_passes = 0;
  double draft_prefill_s = 0;
  double acceptance_rate() const { return drafted_tokens ? (double)accepted_tokens / (double)drafted_tokens : 0.0; }
};

// A decoding sequence that may draft this step.
struct DraftRequest {
  Speculation* spec = nullptr;
  std::span<const int32_t> tokens;  // prompt and generated so far; the last one's K,V not yet computed
  BlockTable* kv = nullptr;         // the target's blocks: drafts take free ones only
  int64_t room = 0;                 // tokens it may still draft (max_tokens less the target's own next one)
  // Cuts a lookup draft at the first token the grammar refuses (none: unconstrained).
  std::function<void(std::vector<int32_t>&)> prune;
  int64_t n_computed() const { return (int64_t)tokens.size() - 1; }
};

// A prompt chunk the target's pass just prefilled, for the draft model's K,V beside it.
struct PrefillChunk {
  Speculation* spec = nullptr;
  std::span<const int32_t> tokens;
  int64_t end = 0;  // the chunk ends at this position
};

// What verify() needs of the sequence: the target's own next token from a row (-1: the
// sequence ended), its verdict on a drafted token (q empty for a lookup draft; none: ended),
// and reporting a token (false: the sequence ended with it).
struct VerifySteps {
  std::function<int32_t(std::span<const float>)> sample;
  std::function<std::optional<Sampler::Verdict>(std::span<const float>, int32_t, std::span<const TokenProb>)> judge;
  std::function<bool(int32_t, std::span<const float>)> emit;
};

class Speculator {
 public:
  // stats: where the counts go (the scheduler's). target: the model verifying the drafts.
  Speculator(const SpeculativeParams& defaults, DraftModel draft_model, const Model& target,
             int64_t max_batch_tokens, SpeculationStats& stats);

  // A request's speculation, or why it cannot have it (a draft mode without a draft model).
  Result<Speculation> start(const std::optional<SpeculativeParams>& asked, const SamplingParams& sampling) const;
  bool has_draft_model() const { return (bool)draft_model_; }

  // Drafts for this step's decoding sequences, within `budget` tokens of the pass, into blocks
  // of the target (and of the draft model) that are free now: speculation never preempts.
  // Fills each one's spec->draft; returns the tokens drafted in all.
  int64_t propose(std::vector<DraftRequest>& reqs, int64_t budget);
  // The draft model's K,V of prompt chunks the target just prefilled, in the same step (its
  // share of prefill lands in time to first token, not in decode).
  void prefill(const std::vector<PrefillChunk>& chunks);

  // The target's rows over a verified draft (row j: its logits after draft[0..j)): keeps the
  // longest prefix it accepts and one token of its own, reporting each through `steps`.
  struct Verified {
    int accepted = 0;
    bool alive = true;  // false: the sequence ended during the walk
  };
  Verified verify(Speculation& sp, std::span<const float> rows, const VerifySteps& steps);
  // After the target kept n_computed tokens' K,V: the draft model keeps no position past them.
  static void rollback(Speculation& sp, int64_t n_computed);

 private:
  // A sequence the draft model drafts for: its tokens so far and how many tokens it may draft.
  struct Job {
    Speculation* sp;
    std::span<const int32_t> tokens;
    int64_t n;
  };
  struct Round;
  int64_t fit_target(const DraftRequest& r, int64_t k);  // target blocks for 1 + k positions: how many fit
  void draft_with_model(const std::vector<Job>& jobs);
  Round reserve_draft_blocks(const std::vector<Job>& jobs);
  Status catch_up(Round& r);
  Status advance(const std::vector<Job>& jobs, const std::vector<int64_t>& upto,
                 const std::function<void(size_t, std::span<const float>)>& at_end);
  Status draft_positions(Round& r);
  void take_proposal(Round& r, size_t i, std::span<const float> row);
  static int64_t reserve_draft_positions(Speculation& sp, int64_t positions);

  SpeculativeParams defaults_;
  DraftModel draft_model_;
  size_t n_vocab_;
  int64_t max_batch_tokens_;
  // The least share of a draft model's draft that must be accepted to pay for its passes and
  // the wider verify pass (draft_model_min_rate, DraftBackoff).
  double draft_cost_ = 0.0;
  SpeculationStats& stats_;
};

}  // namespace tandem
