// Iteration-level continuous batching over the paged KV cache. Each step() runs one forward
// pass holding the next token of every decoding sequence plus chunks of prompts still being
// prefilled (chunked prefill, within a token budget), so a new request starts while others
// are mid-generation. When blocks run out the newest running sequence is preempted: its
// blocks are freed and it is recomputed later from its tokens so far, instead of failing.
// Full blocks are published to the pool's prefix cache, so a request sharing a prefix (a
// system prompt, an earlier turn of a chat) skips that part of prefill.
//
// Every generation runs here: `serve`'s many requests, and `run`/`chat`'s one (Generator), in
// the same pool and the same loop. The naive mode (no KV cache) is an option of the loop: a
// sequence's K,V are forgotten after each token, so every step recomputes all of them.
//
// Not thread-safe: the serving loop (server/) owns it and feeds it from one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_mask.h"
#include "engine/sampler.h"
#include "engine/speculator.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "model/model.h"

namespace tandem {

enum class FinishReason { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct RequestParams {
  std::vector<int32_t> prompt;
  int max_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // end-of-generation ids
  bool want_logprobs = false;
  int top_logprobs = 0;  // > 0: each token event carries this many most likely alternatives
  // Speculative decoding for this request; unset: the scheduler's default
  // (SchedulerOptions::speculative).
  std::optional<SpeculativeParams> speculative;
  // Constrained decoding: every generated token keeps the output a prefix of a sentence of
  // this grammar (tokens that cannot continue it are masked before sampling), and the
  // sequence stops when the sentence is complete and nothing can follow. Needs
  // SchedulerOptions::masker.
  std::shared_ptr<const grammar::Grammar> grammar;
  // The prefix cache's scope (kv/block_allocator.h): cached blocks are shared only between
  // requests of one scope. "" is the shared scope; the server names one per API key, per
  // cache_salt or per request (--prefix-cache-scope).
  std::string cache_scope;
  // Who asked (the server: one per API key; "" for all when it has none). The scheduler shares
  // admission, prefill and preemption fairly between tenants (scheduler_fairness.cpp).
  std::string tenant;
  // Disaggregated serving's prefill rank (engine/prefill_role.h): the sequence computes its
  // prompt's K,V and ends there, sampling nothing: its finish event (FinishReason::Stop)
  // carries the prompt's last logits row, which the decode rank samples the first token from.
  bool prefill_only = false;
};

// What the scheduler reports for a request: one event per generated token, then a last one
// with finish set (and no token).
struct SeqEvent {
  int64_t id = 0;
  int32_t token = -1;
  float logprob = 0;  // log-softmax of the chosen token (when asked for)
  // With RequestParams::top_logprobs = N > 0: the N most likely token ids and their
  // log-softmax values, most likely first, from the same logits as `logprob`.
  std::vector<std::pair<int32_t, float>> top_logprobs;
  FinishReason finish = FinishReason::None;
  bool by_stop_token = false;  // Stop: a stop token ended it (else the grammar's sentence was complete)
  std::string error;  // with Error: what failed; with Length: why it stopped early, if it did
  int n_prompt = 0, n_cached = 0, n_generated = 0;  // on the finish event
  int n_preemptions = 0;  // on the finish event: times its computed K,V were freed for others
  bool over_budget = false;  // with Error: the request's grammar passed its cost budget (a client error)
  std::vector<float> last_logits;  // with RequestParams::prefill_only: the prompt's last row [n_vocab]
};
// Return false to cancel the request (e.g. its client went away).
using SeqCallback = std::function<bool(const SeqEvent&)>;

struct SchedulerOptions {
  int64_t max_batch_tokens = 512;  // tokens per forward pass (decode tokens first)
  int max_running = 64;            // sequences in flight
  // Naive mode: after each sampled token a sequence's K,V are discarded (its blocks become
  // scratch for the next pass) and the prefix cache is not used, so step n recomputes K,V of
  // all n earlier tokens: the O(n^3) baseline the KV cache exists to avoid.
  bool no_kv_cache = false;
  // Requests that do not choose draft this way (never in naive mode). A decoding sequence's
  // draft joins the pass after the decode tokens and prefill chunks, within the token budget,
  // and only into free KV blocks: speculation never preempts or delays real work.
  SpeculativeParams speculative;
  // The vocabulary's token masker, for requests with a grammar (one per tokenizer, shared).
  std::shared_ptr<const grammar::TokenMasker> masker;
  // The draft model for SpeculativeMode::Draft (its vocabulary checked by the caller with
  // check_draft_vocabulary); none: requests asking for that mode are refused by add().
  DraftModel draft_model;
  // After each pass, for every sequence in it: its blocks now hold K,V of its first
  // n_computed positions (a prefill rank streams the blocks this finished to the decode rank).
  std::function<void(int64_t id, const BlockTable& kv, int64_t n_computed)> on_computed;
};

// The speculative decoding counts (drafted, accepted, the draft model's passes) are the
// Speculator's (engine/speculator.h).
struct SchedulerStats : SpeculationStats {
  int64_t steps = 0;
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0;
  int64_t preemptions = 0;
  double pass_s = 0;  // time in forward passes, all steps
  // Constrained decoding: full masks computed (the greedy fast path skips them when the
  // argmax is allowed) and the time spent on masks and matching.
  int64_t masks = 0;
  double mask_s = 0;
};

class Scheduler {
 public:
  struct Seq;  // engine/scheduler_seq.h
  Scheduler(Model& model, BlockPool& pool, const SchedulerOptions& o = {});
  ~Scheduler();

  // Queues a request; events arrive through `cb` during step(). Returns its id, or an error
  // for a request that can never run (empty prompt, prompt past the context or the pool).
  Result<int64_t> add(RequestParams params, SeqCallback cb);
  // Cancels a queued or running request; its blocks are freed at the next step.
  void cancel(int64_t id);
  // Ends every queued and running request now with FinishReason::Error and `why` (a shutdown).
  void abort_all(const std::string& why);
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  // One iteration: schedule, one forward pass, sample, report. Errors of the pass finish the
  // sequences in it with FinishReason::Error; the scheduler stays usable.
  Status step();

  size_t n_waiting() const { return waiting_.size(); }
  size_t n_running() const { return running_.size(); }
  const SchedulerStats& stats() const { return stats_; }

  // Disaggregated serving's decode end (engine/decode_router.h): a request whose prompt K,V
  // another rank computes. prepare() checks it and gives it its id, as add() would, without
  // queueing it (its blocks, Seq::kv, are the caller's to reserve and fill); admit_prefilled()
  // then runs it with n_prompt positions computed, its first token sampled from the prompt's
  // last logits row (grammar, logprobs and stop tokens as for any token); drop_prepared()
  // ends one that never got there with its finish event.
  Result<std::unique_ptr<Seq>> prepare(RequestParams params, SeqCallback cb);
  void admit_prefilled(std::unique_ptr<Seq> s, std::span<const float> last_row, int n_cached);
  void drop_prepared(Seq& s, FinishReason r, const std::string& error = "");
  BlockPool& pool_for_handoff() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  // The vocabulary's token masker (null: constrained requests are refused); immutable, so any
  // thread may check a grammar with it before submitting (TokenMasker::check_start).
  std::shared_ptr<const grammar::TokenMasker> masker() const { return opts_.masker; }

 private:
  struct Planned {  // a sequence and how many of its tokens this step computes (or logit rows)
    Seq* seq;
    int64_t n;
  };
  // step()'s parts: schedule -> run -> postprocess (scheduler.cpp).
  void drop_cancelled();
  void admit_waiting();
  std::vector<Planned> schedule();  // tokens per sequence within the budget; blocks (preempting)
  Result<std::span<const float>> run(const std::vector<Planned>& plan, std::vector<Planned>& logit_rows);
  void postprocess(const std::vector<Planned>& plan, const std::vector<Planned>& logit_rows, std::span<const float> logits);

  // Paging (scheduler_paging.cpp); a sequence's blocks are its BlockTable's (kv/block_table.h).
  bool admit(Seq& s);                 // prefix-cache lookup and first blocks; false if none free
  // The most blocks a sequence of n_tokens needs at once in all groups together.
  int64_t blocks_for_tokens(int64_t n_tokens) const;
  void preempt(Seq& s);
  // Preempts a running sequence and moves it to the waiting queue's front (it waits for
  // blocks) or back (it gave way to another tenant).
  void requeue(Seq& s, bool at_front);
  // Of the tenant holding the most running sequences, the newest that made progress since its
  // last preemption (fairness between tenants: scheduler_fairness.cpp).
  Seq* preemption_victim();
  size_t next_admission() const;     // the waiting sequence to admit next: the least-served tenant's
  bool preempt_for_waiting_tenant();  // all slots taken and a tenant has none: free one of the largest's
  void plan_prefill(std::vector<Planned>& plan, int64_t& budget);  // prefill chunks, the budget shared by tenant
  bool preempt_for_blocks_of(const Seq& s);  // no blocks for s, its tenant has none running: free the largest's
  // A step of only the prefills of tenants that have nothing decoding, when they fit: true if planned.
  bool plan_first_tokens(std::vector<Planned>& plan, int64_t budget);
  void release_blocks(Seq& s);  // its blocks and its draft model's
  // A prefill_only sequence's prompt is done: its finish event carries the last row.
  void finish_prefill(Seq& s, std::span<const float> row);

  // Emission (scheduler_emission.cpp).
  // Reports one generated token; false when the sequence ended with it (finished, or `done`).
  bool emit(Seq& s, int32_t tok, std::span<const float> row, std::vector<Seq*>& done);
  void finish(Seq& s, FinishReason r, const std::string& error = "", bool by_stop_token = false);

  // Grammar constraints (scheduler_constraints.cpp).
  // The next token from one logits row, under the sequence's grammar if it has one; -1 when
  // the grammar allows no token of the vocabulary (the sequence is finished with an error).
  int32_t sample_next(Seq& s, std::span<const float> row);
  // The grammar's mask for the sequence's next token (empty span: unconstrained); `keep`
  // holds it alive.
  std::span<const uint64_t> allowed_tokens(Seq& s, std::shared_ptr<const grammar::TokenMask>& keep);
  // Cuts a lookup draft at the first token s's grammar refuses.
  void prune_draft_to_grammar(const Seq& s, std::vector<int32_t>& draft);

  // Speculative decoding's scheduler side (scheduler_speculation.cpp); the Speculator drafts.
  void propose_drafts(std::vector<Planned>& plan, int64_t budget);  // after blocks: drafts into free ones
  void draft_prefill(const std::vector<Planned>& plan);  // the draft model's K,V of this pass's prompt chunks
  void verify_draft(Seq& s, std::span<const float> rows, std::vector<Seq*>& done);

  Model& model_;
  BlockPool& pool_;
  SchedulerOptions opts_;
  SchedulerStats stats_;
  Speculator speculator_;  // counts into stats_
  int64_t next_id_ = 1;
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;  // oldest first
};

}  // namespace tandem
