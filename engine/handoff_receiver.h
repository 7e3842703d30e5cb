// The decode end of KV hand-offs in disaggregated serving (engine/disaggregation.h), on every
// decode rank (rank 0 under the router, the others under their DecodeRole): a prepared
// sequence whose blocks were reserved for its whole prompt waits here while a prefill rank
// streams its K,V into them; once the last block has landed and the prefill rank has sent the
// prompt's last logits row, it joins the decode Scheduler (admit_prefilled). A sequence that
// ends before then (cancelled, its prefill rank failed) keeps its blocks until the prefill
// rank has stopped sending into them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/peer_link.h"
#include "core/timer.h"
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

struct ReceiverStats {
  int64_t handoffs = 0, blocks_received = 0, bytes_received = 0;
};

class HandoffReceiver {
 public:
  HandoffReceiver(Scheduler& decode, PeerLink& link);
  ~HandoffReceiver();

  // `seq` (Scheduler::prepare'd, its blocks reserved for its whole prompt) gets its K,V from
  // prefill rank `from`, which names it `key` in its messages. `waited_s`: how long it waited
  // before its prompt went to that rank (part of its queue time).
  void expect(int64_t key, std::unique_ptr<Scheduler::Seq> seq, int from, double waited_s);
  // A Blocks, Done or Ended message from prefill rank `from` (others are not its business).
  void handle(int from, const HandoffMessage& m);
  // Ends `key` for its client now (cancelled); false when it is not here.
  bool cancel(int64_t key);
  // No prefill rank will send `key`'s blocks (its prompt was never sent to one): its blocks
  // go back now.
  void abandon(int64_t key);
  // Receives that landed; the sequences whose K,V are all here join the scheduler (or, with
  // admit false, as while stopping, end as cancelled).
  void settle(bool admit = true);
  // Prefill rank `rank` died: its hand-offs end with `why` and their blocks go back, but for
  // those a receive may still write into (one MPI could not cancel), which are never reused.
  void fail_from(int rank, const std::string& why);
  // Every hand-off ends (as cancelled, or with `error`); their blocks go back as their senders stop.
  void end_all(FinishReason why = FinishReason::Cancelled, const std::string& error = "");

  bool empty() const { return handoffs_.empty(); }
  size_t size() const { return handoffs_.size(); }
  bool has(int64_t key) const { return handoffs_.count(key) > 0; }
  const ReceiverStats& stats() const { return stats_; }
  std::function<void(int64_t key, const HandoffTiming&)> on_admitted;  // just before its first token

 private:
  struct Handoff {
    std::unique_ptr<Scheduler::Seq> seq;  // null once it ended here (cancelled, failed)
    BlockTable held;                      // its blocks once seq is gone, until the sender stops
    int from = 0;
    struct Receive {
      PeerLink::Handle handle;
      int32_t block;  // the pool block it lands in; -1: the scratch buffer
    };
    std::vector<Receive> receives;
    bool prefill_done = false, ended = false;
    std::vector<float> last_row;
    int64_t n_cached = 0, blocks = 0;
    double waited_s = 0, expected_at = 0, first_block_at = -1, done_at = 0, queue_s = 0, prefill_s = 0;
  };
  Handoff* find(int from, int64_t key);
  void on_blocks(int from, const HandoffMessage& m);
  void end_here(Handoff& h, FinishReason why, const std::string& error);
  double now() const { return clock_.seconds(); }

  Scheduler& decode_;
  BlockPool& pool_;
  PeerLink& link_;
  Timer clock_;
  std::map<int64_t, Handoff> handoffs_;  // by key
  std::vector<int32_t> lost_;            // blocks a dead rank's receives may still write: held, never reused
  std::vector<uint8_t> discard_;         // payloads of a request no longer here land in this
  ReceiverStats stats_;
};

}  // namespace tandem
