// Rank 0 of disaggregated serving (engine/disaggregation.h): routes each request to a decode
// rank (itself, or one of ranks P+1..P+D-1: the least loaded by sequences, then by KV blocks in
// use) and to a prefill rank. For its own requests it reserves their blocks in the decode pool
// and receives the K,V the prefill rank streams into them (engine/handoff_receiver.h), then
// admits them into the decode Scheduler (the serving loop's). Another decode rank does the same
// in its DecodeRole (engine/decode_role.h) and streams each step's tokens back; the router
// hands them to the request's callback as its own scheduler would, and sends cancellations
// there. It never runs a prefill chunk. A rank that falls silent is marked down: its requests
// fail with an error naming it, later ones go to the others.
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
#include "engine/handoff_receiver.h"
#include "engine/scheduler.h"

namespace tandem {

// A prefill rank as the router sees it (its last heartbeat, and what the router routed there).
struct PrefillRankState {
  int rank = 0;
  bool up = true;
  std::string why_down;
  int64_t used_blocks = 0, total_blocks = 0, queued_tokens = 0, blocks_sent = 0, bytes_sent = 0;
  double busy_s = 0;
  int64_t routed_tokens = 0;  // prompt tokens routed there and not yet handed on
};

// A decode rank (rank 0 included) as the router sees it.
struct DecodeRankState {
  int rank = 0;
  bool up = true;
  std::string why_down;
  int64_t requests = 0;  // routed there and not finished
  int64_t routed = 0;    // routed there in all
  int64_t used_blocks = 0, total_blocks = 0, blocks_received = 0, bytes_received = 0, handoffs = 0;
  double busy_s = 0;
};

struct RouterStats {
  // Rank 0's own hand-offs (decode rank 0), and requests failed by a dead rank (any).
  int64_t handoffs = 0, blocks_received = 0, bytes_received = 0, failed_requests = 0;
  int64_t waiting = 0, in_flight = 0;  // for decode blocks on rank 0; prompts out at prefill ranks
  std::vector<PrefillRankState> ranks;
  std::vector<DecodeRankState> decoders;  // rank 0 first, then P+1..P+D-1
};

class DecodeRouter {
 public:
  DecodeRouter(Scheduler& decode, PeerLink& link, const DisaggregationOptions& o);
  ~DecodeRouter();  // stop()

  // Checks the request as the decode scheduler would (Scheduler::prepare) and routes it; an
  // error when refused, or when no prefill rank is up.
  Result<int64_t> submit(RequestParams p, SeqCallback cb);
  // True when `id` was one of the router's (queued, its K,V on the way, or decoding on another
  // rank): it ends as cancelled now; its blocks go back once no rank writes into them.
  bool cancel(int64_t id);
  // Messages, landed blocks, hand-offs, other ranks' tokens, silent ranks, queued requests.
  void poll();
  bool has_work() const { return !waiting_.empty() || !receiver_.empty() || !remote_.empty() || !prefilling_.empty(); }
  // Ends every request of the router's with `why` (a drain's deadline): those waiting, those
  // whose prompt is out at a prefill rank (told to stop; their blocks go back once it has) and
  // those decoding on other ranks (cancelled there). Rank 0's own decoding ones are the
  // scheduler's (Scheduler::abort_all).
  void abort_all(const std::string& why);
  // Tells the other ranks to stop and waits (up to the peer timeout) until they have.
  void stop();

  RouterStats stats() const;  // any thread
  std::function<void(const HandoffTiming&)> on_handoff;  // engine thread, once per request that starts decoding

 private:
  struct Rank {  // a prefill rank
    PrefillRankState state;
    double heard_at = 0;
    bool stopped = false;
    int64_t picked_at = 0;                                // when it was last chosen (tick_)
    std::unordered_map<uint64_t, int64_t> recent_blocks;  // prefix hashes routed here -> when
  };
  struct Decoder {  // a decode rank other than 0
    DecodeRankState state;
    double heard_at = 0;
    bool stopped = false;
  };
  struct Prefilling {  // a prompt out at a prefill rank (or about to be)
    int prefill_rank = 0, decode_rank = 0;
    int64_t n_prompt = 0;
    bool sent = false;
  };
  struct Remote {  // a request decoded by another rank
    int decode_rank = 0;
    SeqCallback cb;
    bool ended = false;  // its client has its finish event
    int64_t n_tokens = 0;  // prompt and generated so far (its KV blocks there, as the router counts them)
    std::vector<int32_t> prompt;
    std::string cache_scope, tenant;
  };

  // Either kind of peer: drains its messages into handle(), marking it down on one that does
  // not parse; and a Hello's check that its blocks are the size of this rank's.
  template <class Peer>
  void receive_from(Peer& p);
  template <class Peer>
  void check_hello(Peer& p, const HandoffMessage& m);
  static const char* role_of(const Rank&) { return "prefill"; }
  static const char* role_of(const Decoder&) { return "decode"; }

  // Prefill ranks (decode_router.cpp).
  void handle(Rank& r, const HandoffMessage& m);
  void prompt_done(int64_t id, int prefill_rank);
  void check_silence();
  void mark_down(Rank& r, const std::string& why);
  void dispatch_waiting();
  bool dispatch(std::unique_ptr<Scheduler::Seq>& s);
  Rank* choose_rank(const std::vector<uint64_t>& hashes);
  void note_routed(Rank& r, const std::vector<uint64_t>& hashes, int64_t n);
  std::vector<uint64_t> prefix_hashes(const Scheduler::Seq& s) const;

  // Decode ranks other than 0 (decode_router_remote.cpp).
  int choose_decoder();
  void route_remote(std::unique_ptr<Scheduler::Seq> s, Decoder& d);
  void handle(Decoder& d, const HandoffMessage& m);
  void on_reserved(Decoder& d, const HandoffMessage& m);
  void on_events(Decoder& d, const HandoffMessage& m);
  void end_remote(int64_t id, Remote& rm, FinishReason why, const std::string& error);
  void mark_down(Decoder& d, const std::string& why);
  Decoder* decoder(int rank);

  void send(int rank, const HandoffMessage& m) { link_.send(rank, m.encode()); }
  void publish_stats();
  double now() const { return clock_.seconds(); }

  Scheduler& decode_;
  BlockPool& pool_;
  PeerLink& link_;
  DisaggregationOptions opts_;
  Timer clock_;
  HandoffReceiver receiver_;  // rank 0's own hand-offs
  std::vector<Rank> ranks_;        // ranks 1..P
  std::vector<Decoder> decoders_;  // ranks P+1..P+D-1
  std::deque<std::unique_ptr<Scheduler::Seq>> waiting_;  // for a prefill rank and decode blocks on rank 0
  std::map<int64_t, double> submitted_at_;                // by id, while waiting
  std::map<int64_t, Prefilling> prefilling_;              // by id
  std::map<int64_t, Remote> remote_;                      // by id, until its finish comes back
  std::vector<int64_t> picked_at_;  // by decode rank index (0: rank 0): when it was last chosen
  int64_t routed_here_ = 0;         // requests rank 0 was chosen to decode
  double heartbeat_at_ = -1e9;
  int64_t tick_ = 0;
  bool stopped_ = false;
  int64_t failed_requests_ = 0;
  mutable std::mutex stats_mu_;
  RouterStats published_;  // under stats_mu_
};

}  // namespace tandem
