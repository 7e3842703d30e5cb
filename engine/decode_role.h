// A decode rank of disaggregated serving other than rank 0 (engine/disaggregation.h; ranks
// P+1..P+D-1): the router sends it the requests it chose this rank for; for each it reserves
// the prompt's blocks in its own pool (its own prefix cache first) and says which blocks the
// prefill rank must still send, receives them (engine/handoff_receiver.h), and decodes the
// sequence with its own Scheduler (continuous batching, grammar, lookup speculation, stop
// tokens, logprobs), sending the router each step's tokens and the finish. The router's Cancel
// ends a request here and its blocks come back. It never runs a prefill chunk.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>

#include "backend/peer_link.h"
#include "core/error.h"
#include "engine/disaggregation.h"
#include "engine/handoff_message.h"
#include "engine/handoff_receiver.h"
#include "engine/scheduler.h"

namespace tandem {

class DecodeRole {
 public:
  // `so` is the scheduler's (the same as rank 0's: masker, speculation); the router is rank
  // `router`, the prefill ranks 1..o.n_prefill.
  DecodeRole(Model& model, BlockPool& pool, PeerLink& link, const SchedulerOptions& so, const DisaggregationOptions& o,
             int router = 0);
  ~DecodeRole();
  // Serves the router until it says Stop (Ok), or until it falls silent past the timeout (an
  // error naming the wait).
  Status run();

 private:
  struct Waiting {  // a request with no blocks yet
    int64_t key = 0;
    int prefill_rank = 0;
    std::unique_ptr<Scheduler::Seq> seq;
    double since = 0;
  };
  Status receive();
  void handle_router(const HandoffMessage& m);
  void add(const HandoffMessage& m);
  void cancel(int64_t key);
  void reserve_waiting();
  void on_event(int64_t key, const SeqEvent& e);
  void flush_events();
  void heartbeat();
  double now() const;

  PeerLink& link_;
  DisaggregationOptions opts_;
  int router_;
  Scheduler sched_;
  BlockPool& pool_;
  HandoffReceiver receiver_;
  std::deque<Waiting> waiting_;
  std::map<int64_t, int64_t> local_of_;         // router id -> this scheduler's id, until its finish
  std::map<int64_t, HandoffMessage> outbox_;    // router id -> its events since the last flush
  std::map<int64_t, HandoffTiming> timing_;     // router id -> its hand-off, sent with its first events
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double heard_at_ = 0, heartbeat_at_ = -1e9;
  bool stopping_ = false;
};

}  // namespace tandem
