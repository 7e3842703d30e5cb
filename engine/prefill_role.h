// A prefill rank of disaggregated serving (engine/disaggregation.h): a Scheduler of
// prefill_only sequences (chunked prefill, its own prefix cache, fairness between tenants,
// preemption) whose finished blocks stream after every pass to the decode rank the router
// chose for each request (rank 0, or another decode rank).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "backend/peer_link.h"
#include "core/error.h"
#include "engine/disaggregation.h"
#include "engine/handoff_message.h"
#include "engine/scheduler.h"

namespace tandem {

class PrefillRole {
 public:
  // `so` is the scheduler's; its on_computed, if any, runs after each pass's blocks are sent
  // (tests use it to kill a rank mid-request). The router is rank `router`.
  PrefillRole(Model& model, BlockPool& pool, PeerLink& link, SchedulerOptions so, const DisaggregationOptions& o,
              int router = 0);
  ~PrefillRole();
  // Serves the router until it says Stop (Ok), or until it falls silent past the timeout (an
  // error naming the wait).
  Status run();

 private:
  struct Job {  // one request on this rank
    int64_t router_id = 0;
    int decode_rank = 0;  // where its blocks and last row go
    int64_t n_prompt = 0, skip_blocks = 0, next_block = 0;
    double added_at = 0, started_at = -1;
  };
  struct InFlight {  // a block on its way to the router, held until it has left
    PeerLink::Handle handle;
    int32_t block;
  };
  void handle(const HandoffMessage& m);
  void add(const HandoffMessage& m);
  void on_event(int64_t local_id, const SeqEvent& e);
  void send_blocks(int64_t local_id, const BlockTable& kv, int64_t n_computed);
  void reap_sends();
  void heartbeat_loop();
  HandoffMessage load_report() const;
  double now() const;

  Model& model_;
  BlockPool& pool_;
  PeerLink& link_;
  DisaggregationOptions opts_;
  int router_;
  Scheduler sched_;
  std::map<int64_t, Job> jobs_;               // by local (this scheduler's) id
  std::map<int64_t, int64_t> local_of_;       // router id -> local id
  std::vector<InFlight> in_flight_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double step_started_ = 0, heard_at_ = 0;
  bool stopping_ = false;
  int64_t blocks_sent_ = 0, bytes_sent_ = 0;
  // What the heartbeat thread reports (written by the engine thread).
  std::atomic<int64_t> used_blocks_{0}, queued_tokens_{0}, blocks_sent_now_{0}, bytes_sent_now_{0};
  std::atomic<double> busy_s_{0};
  std::atomic<bool> quit_{false}, sending_{false};
  std::thread heartbeat_;
};

}  // namespace tandem
