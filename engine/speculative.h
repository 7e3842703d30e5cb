// Speculative decoding's settings and its per-sequence back-off. A decode step of a sequence
// with a draft runs its next token plus the k drafted ones in one pass (the weights are read
// once for all k + 1), and keeps the longest prefix the target agrees with plus the target's
// own next token. Drafts that keep failing cost a wider pass for nothing, so each sequence
// shrinks its drafts after rejections and stops drafting for a while after repeated misses.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "engine/draft_lookup.h"

namespace tandem {

// Lookup drafts by prompt lookup (engine/draft_lookup.h); Draft runs a smaller model of the
// same vocabulary (engine/draft_model.h) for k cheap decode passes.
enum class SpeculativeMode { Off, Lookup, Draft };
const char* speculative_mode_name(SpeculativeMode m);         // "off", "lookup", "draft"
Result<SpeculativeMode> parse_speculative_mode(const std::string& name);

struct SpeculativeParams {
  SpeculativeMode mode = SpeculativeMode::Off;
  // Tokens proposed per step at most. Each drafted token widens the verify pass; on a CPU
  // whose matmuls are near compute-bound at a few tokens (SmolLM2-135M Q4_1, 2 threads: a
  // 2-token pass costs ~1.2 single ones, a 5-token one ~2.1; bench/pass_cost.cpp) short
  // drafts pay best: replaying the bundled model's outputs, 4 to 6 gave the most. Raise it
  // where wider passes are nearly free (many cores, a GPU).
  int draft_max = 4;
  LookupDraftParams lookup;
  // Draft model: stop drafting further tokens once the draft model's most likely next token
  // has less than this probability (its raw softmax): a draft it is unsure of is mostly
  // rejected, and each drafted token costs a draft pass and a wider verify pass. The test
  // looks at the distribution only, never at the token drawn, so sampling stays exact.
  // Default 0 (never stop): a draft model that agrees is right even when unsure (SmolLM2 F16
  // <- its Q4_1: 96-100% acceptance, and 0.5 declined most positions, each decline having
  // cost a pass), and the back-off already limits one that does not.
  float draft_p_min = 0.0f;
};

// The least share of a draft model's draft that must be accepted for it to have paid, in
// units of the target's decode pass: each drafted token costs a draft-model pass (its weight
// bytes over the target's: decode reads every weight) and widens the verify pass by about a
// quarter of a decode pass (SmolLM2 Q4_1 on 2 cores: a 5-token pass costs ~2.1 one-token
// passes). Below it a partly accepted draft counts as a miss (DraftBackoff::verified).
constexpr double kVerifyTokenShare = 0.25;
inline double draft_model_min_rate(double draft_bytes, double target_bytes) {
  const double r = draft_bytes / (target_bytes > 1.0 ? target_bytes : 1.0) + kVerifyTokenShare;
  return r < 1.0 ? r : 1.0;
}

// How many tokens a sequence may draft this step, from how its recent drafts fared: the
// allowance doubles (up to draft_max) after a draft accepted whole and drops to one past the
// accepted count after a partial one; two fully rejected (or declined) drafts in a row pause
// drafting for 2 steps, and every further one doubles the pause (up to max_pause), so on text that does not
// repeat itself the verify passes become rare.
class DraftBackoff {
 public:
  // A missed lookup draft costs only its verify pass's extra width. A draft model's costs its
  // passes and, after a pause, a catch-up pass over every token it has not seen (at small-batch
  // prefill rate): on text it cannot predict (a random Qwen pair's free text) a 32-step cap kept
  // it catching up on nearly the whole output, 8-11% below plain decode. So a draft model's
  // back-off (draft_model) is more patient: pauses quadruple up to 128 steps, a draft that
  // paid takes one miss off the streak instead of clearing it, and none counts as paid while
  // the sequence's recent drafts, on balance, do not pay: a ledger of accepted tokens less
  // their price (min_rate per drafted token), each older entry weighing kLedgerDecay less, so
  // one lucky token of a poor draft model does not restart its short pauses, and a draft model
  // that starts poorly and then agrees (a code edit reaching the copied code) recovers within a
  // draft or two (a ledger that never forgot, the acceptance rate so far, kept it paused).
  // Each resumption still reruns every skipped token through the draft model, a cost per
  // token whatever the pause (the random pair's rewrite: 7% of decode for one accepted
  // token), so a draft model that has missed kGiveUpAtCap probes in a row at the longest pause
  // (some 470 tokens without paying) stops drafting for the rest of the sequence.
  static constexpr int kMaxPause = 32;
  static constexpr int kMaxPauseDraftModel = 128;
  static constexpr int kGiveUpAtCap = 3;
  explicit DraftBackoff(int draft_max = 8, bool draft_model = false)
      : max_(draft_max < 0 ? 0 : draft_max),
        cap_(max_),
        max_pause_(draft_model ? kMaxPauseDraftModel : kMaxPause),
        draft_model_(draft_model) {}

  // Tokens allowed this step; 0 while paused (or, a draft model, after giving up).
  int allowed() const { return pause_ > 0 || gave_up_ ? 0 : cap_; }
  // A decode step ran without a draft (paused): one step of the pause is served.
  void step_without_draft() {
    if (pause_ > 0) pause_--;
  }
  // min_rate: the share of a draft that must be accepted for the draft to have paid (a draft
  // model: its pass costs about its bytes over the target's per drafted token); below it a
  // partly accepted draft counts as a miss too.
  void verified(int drafted, int accepted, double min_rate = 0.0);
  // The drafter ran and proposed nothing (a draft model unsure of its first token): as costly
  // as a draft rejected whole (the draft model's pass was spent), and it counts as one toward
  // the pause, so a draft model that is never sure stops costing a pass per step.
  void declined();

 private:
  int max_;
  int cap_;
  int max_pause_;
  bool draft_model_;
  // A draft model's ledger, in target decode passes: sum of (accepted - min_rate * drafted)
  // over its drafts, the newest weighing 1 and each older one kLedgerDecay times the next.
  // 0.25: on the random Qwen pair (bench/speculative.py) the code edit, poor at first, went
  // 0.94x / 1.09x / 1.32x at decays 1 / 0.5 / 0.25, while rewrite and free text drafted
  // about as rarely at each (9-16 tokens of 128).
  static constexpr double kLedgerDecay = 0.25;
  double ledger_ = 0.0;
  int misses_ = 0;  // fully rejected drafts in a row
  int pause_ = 0;   // steps left without drafting
  int missed_at_cap_ = 0;  // a draft model's misses in a row that paused it for max_pause_
  bool gave_up_ = false;
};

}  // namespace tandem
