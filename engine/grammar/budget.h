// What constrained decoding may cost one request, so that a grammar whose parses multiply or
// deepen with every byte ends its own request with an error instead of slowing every other
// request on the engine thread and filling memory.
//
// Three kinds of bound, each checked as the work happens:
// - StateLimits: one parse state (the matcher's stacks): how many parses are alive at once, how
//   deep one goes, how many ints the whole state holds. Past them a token cannot be accepted.
// - MaskBudget: one token mask: the DFA work its trie walk does (settle steps, stack ints and
//   table rows built) and its wall time, checked inside LazyDfa::fill.
// - GrammarBudget::cache_*: the token masker's caches, in bytes, for all grammars together and
//   for any one grammar (state_cache.h).
// Real JSON Schemas and GBNF grammars stay orders of magnitude below the defaults (the tests in
// tests/test_grammar_budget.cpp show both sides).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

#include <fmt/format.h>

namespace tandem::grammar {

struct StateLimits {
  size_t max_stacks = 1024;           // parses alive at once
  size_t max_depth = 1024;            // frames on one parse's stack
  size_t max_state_ints = 1u << 15;   // the flat state: every stack's frames, plus one length each
  size_t max_settle_work = 1u << 18;  // settle steps for one byte (empty alternatives that multiply)
};

// Recursion bound of settling one byte: past it the grammar is left-recursive in a way
// validate() did not see.
inline constexpr int kMaxSettleDepth = 4096;

// Which bound a step passed.
enum class Overflow : uint8_t { None, Stacks, Depth, StateSize, SettleWork, SettleDepth };

// "more than 1024 parses alive at once (max_stacks)", for messages.
inline std::string describe(Overflow o, const StateLimits& l) {
  switch (o) {
    case Overflow::Stacks: return fmt::format("more than {} parses alive at once (max_stacks)", l.max_stacks);
    case Overflow::Depth: return fmt::format("a parse more than {} frames deep (max_depth)", l.max_depth);
    case Overflow::StateSize: return fmt::format("a parse state of more than {} ints (max_state_ints)", l.max_state_ints);
    case Overflow::SettleWork: return fmt::format("more than {} expansions for one byte (max_settle_work)", l.max_settle_work);
    case Overflow::SettleDepth:
      return fmt::format("expansions more than {} deep without reading a byte (left recursion)", kMaxSettleDepth);
    case Overflow::None: break;
  }
  return "no bound passed";
}

// How much slower than a release build this build runs the same work: ASan (gcc's
// __SANITIZE_ADDRESS__, clang's address_sanitizer feature) makes an honest mask 2-5x slower, so
// the CPU-time bound scales with it; the work-unit bound, which is what stops a hostile
// grammar early, does not (the sanitized suite ran Gemma's and o200k's honest masks past 20 ms).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr int kBuildSlowdown = 5;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr int kBuildSlowdown = 5;
#else
inline constexpr int kBuildSlowdown = 1;
#endif
#else
inline constexpr int kBuildSlowdown = 1;
#endif

struct GrammarBudget {
  StateLimits state;
  // One token mask: DFA work units (a settle step, a stack stored, sorted or looked up, a
  // table entry) and the computing thread's CPU time (not wall time: on a busy machine a
  // preempted mask would fail an honest request, issue 51's Gemma calls under load). 0 work: kMaskWorkPerVocabToken per vocabulary token (the masker
  // sets it), since a mask's honest cost grows with the vocabulary. The costliest real masks
  // measured, strings of bounded length (every trie node a new DFA state), take up to ~3 units
  // per token (152k units, ~0.5 ms, on SmolLM2's 49k tokens); issue 34's probe spends ~150k
  // units per millisecond, so SmolLM2's default (786k) stops a probe's mask within ~5 ms, one
  // decode step: a probe cannot hold the other requests' tokens up by more than ~2x.
  size_t max_mask_work = 0;
  std::chrono::microseconds max_mask_time{20'000 * kBuildSlowdown};
  // The masker's caches (masks by state, walks by top), each: all grammars, and one grammar.
  size_t cache_bytes = size_t{32} << 20;
  size_t cache_bytes_per_grammar = size_t{8} << 20;
};

inline constexpr size_t kMaskWorkPerVocabToken = 16;
inline constexpr size_t kMinMaskWork = size_t{1} << 16;  // small vocabularies

// The running account of one mask computation, shared by the DFAs it builds.
class MaskBudget {
 public:
  explicit MaskBudget(const GrammarBudget& b)
      : max_work_(b.max_mask_work), max_time_(b.max_mask_time), start_(thread_cpu_time()) {}

  // Adds `work` units; false once a bound is passed (error() says which). The clock is read
  // every few thousand units (microseconds of work), not on every call.
  bool charge(size_t work) {
    if (exceeded()) return false;
    work_ += work;
    if (work_ > max_work_) {
      error_ = fmt::format("grammar budget: one token's mask needed more than {} units of parser work (max_mask_work)", max_work_);
      return false;
    }
    if (work_ >= next_clock_check_) {
      next_clock_check_ = work_ + kClockCheckEvery;
      if (thread_cpu_time() - start_ > max_time_) {
        error_ = fmt::format("grammar budget: one token's mask used more than {} ms of CPU time (max_mask_time)", max_time_.count() / 1000.0);
        return false;
      }
    }
    return true;
  }
  // Ends the computation with `why` (a state bound passed while walking).
  void fail(std::string why) {
    if (!exceeded()) error_ = std::move(why);
  }
  bool exceeded() const { return !error_.empty(); }
  static std::chrono::nanoseconds thread_cpu_time() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  }
  const std::string& error() const { return error_; }
  size_t work() const { return work_; }

 private:
  static constexpr size_t kClockCheckEvery = 4096;
  size_t work_ = 0, max_work_, next_clock_check_ = 0;
  std::chrono::microseconds max_time_;
  std::chrono::nanoseconds start_;  // the thread's CPU time when the mask began
  std::string error_;
};

}  // namespace tandem::grammar
