// Rank 0 of disaggregated serving (engine/disaggregation.h): routes each request to a prefill
// rank, reserves its blocks in the decode pool, receives the K,V the prefill rank streams into
// them, and admits the sequence into the decode Scheduler (the serving loop's) with the
// prompt's last logits row. It never runs a prefill chunk. A prefill rank that falls silent is
// marked down: its requests fail with an error naming it, later ones go to the others.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/peer_link.h"
#include "core/timer.h"
#include "engine/disaggregation.h"
#include "engine/handoff_message.h"
#include "engine/scheduler.h"

namespace tandem {

// One request's time to first token, in parts.
struct HandoffTiming {
  double queue_s = 0;     // submitted -> its prefill started (the router's and the prefill rank's queues)
  double prefill_s = 0;   // its chunks on the prefill rank
  double transfer_s = 0;  // prefill done -> its last block landed (what the stream did not overlap)
  double stream_s = 0;    // its first block announced -> its last landed (the whole transfer)
  int64_t blocks = 0, bytes = 0;
};

// A prefill rank as the router sees it (its last heartbeat, and what the router routed there).
struct PrefillRankState {
  int rank = 0;
  bool up = true;
  std::string why_down;
  int64_t used_blocks = 0, total_blocks = 0, queued_tokens = 0, blocks_sent = 0, bytes_sent = 0;
  double busy_s = 0;
  int64_t routed_tokens = 0;  // prompt tokens routed there and not yet handed back
};

struct RouterStats {
  int64_t handoffs = 0, blocks_received = 0, bytes_received = 0, failed_requests = 0, waiting = 0, in_flight = 0;
  std::vector<PrefillRankState> ranks;
};

class DecodeRouter {
 public:
  DecodeRouter(Scheduler& decode, PeerLink& link, const DisaggregationOptions& o);
  ~DecodeRouter();  // stop()

  // Checks the request as the decode scheduler would (Scheduler::prepare) and queues it for a
  // prefill rank; an error when refused, or when no prefill rank is up.
  Result<int64_t> submit(RequestParams p, SeqCallback cb);
  // True when `id` was one of the router's (queued, or its K,V on the way): it ends as
  // cancelled now; its blocks go back once the prefill rank has stopped sending them.
  bool cancel(int64_t id);
  // Messages, landed blocks, hand-offs, silent ranks, queued requests: call often.
  void poll();
  bool has_work() const { return !waiting_.empty() || !handoffs_.empty(); }
  // Tells the prefill ranks to stop and waits (up to the peer timeout) until they have.
  void stop();

  RouterStats stats() const;  // any thread
  std::function<void(const HandoffTiming&)> on_handoff;  // engine thread, once per admitted request

 private:
  struct Handoff {
    std::unique_ptr<Scheduler::Seq> seq;  // null once it ended here (cancelled, failed)
    BlockTable held;                      // its blocks once seq is gone, until the sender stops
    int rank = 0;
    std::vector<PeerLink::Handle> receives;
    bool prefill_done = false, ended = false;
    std::vector<float> last_row;
    int64_t n_prompt = 0, n_cached = 0, blocks = 0;
    double submitted_at = 0, dispatched_at = 0, first_block_at = -1, done_at = 0, queue_s = 0, prefill_s = 0;
  };
  struct Rank {
    PrefillRankState state;
    double heard_at = 0;
    bool stopped = false;
    std::unordered_map<uint64_t, int64_t> recent_blocks;  // prefix hashes routed here -> when
  };

  void receive_from(Rank& r);
  void handle(Rank& r, const HandoffMessage& m);
  void on_blocks(Rank& r, const HandoffMessage& m);
  void end_here(Handoff& h, FinishReason why, const std::string& error);
  void finish_handoffs();
  void check_silence();
  void mark_down(Rank& r, const std::string& why);
  void dispatch_waiting();
  bool dispatch(std::unique_ptr<Scheduler::Seq>& s);
  Rank* choose_rank(const std::vector<uint64_t>& hashes);
  std::vector<uint64_t> prefix_hashes(const Scheduler::Seq& s) const;
  void send(int rank, const HandoffMessage& m) { link_.send(rank, m.encode()); }
  void publish_stats();
  double now() const { return clock_.seconds(); }

  Scheduler& decode_;
  BlockPool& pool_;
  PeerLink& link_;
  DisaggregationOptions opts_;
  Timer clock_;
  std::vector<Rank> ranks_;                            // ranks 1..P
  std::deque<std::unique_ptr<Scheduler::Seq>> waiting_;  // for a prefill rank and decode blocks
  std::map<int64_t, Handoff> handoffs_;                 // by id, dispatched
  std::map<int64_t, double> submitted_at_;              // by id, while waiting
  std::vector<BlockTable> lost_;  // blocks a dead rank's receives may still write: never reused
  std::vector<uint8_t> discard_;  // payloads of a request no longer here land in this
  double heartbeat_at_ = -1e9;
  int64_t tick_ = 0;
  bool stopped_ = false;
  RouterStats counters_;
  mutable std::mutex stats_mu_;
  RouterStats published_;  // under stats_mu_
};

}  // namespace tandem
