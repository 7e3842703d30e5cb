#include "engine/decode_role.h"

#include <thread>

#include <fmt/core.h>

#include "engine/handoff_request.h"
#include "engine/scheduler_seq.h"

namespace tandem {

DecodeRole::DecodeRole(Model& model, BlockPool& pool, PeerLink& link, const SchedulerOptions& so,
                       const DisaggregationOptions& o, int router)
    : link_(link),
      opts_(o),
      router_(router),
      sched_(model, pool,
             [&] {
               SchedulerOptions s = so;
               s.on_computed = {};  // nothing is sent on from here
               s.draft_model = {};  // refused beside --disaggregate
               return s;
             }()),
      pool_(pool),
      receiver_(sched_, link) {
  receiver_.on_admitted = [this](int64_t key, const HandoffTiming& t) { timing_[key] = t; };
}

DecodeRole::~DecodeRole() = default;

double DecodeRole::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

Status DecodeRole::run() {
  link_.send(router_, HandoffMessage::hello((int64_t)pool_.block_bytes(), pool_.n_blocks()).encode());
  heard_at_ = now();
  int idle_polls = 0;
  for (;;) {
    TANDEM_TRY(receive());
    if (now() - heard_at_ > opts_.peer_timeout_s)
      return make_error("decode rank {}: the router (rank {}) sent nothing for {:.0f} s: it died or stopped answering",
                        link_.rank(), router_, opts_.peer_timeout_s);
    reserve_waiting();
    receiver_.settle(!stopping_);
    const bool work = sched_.has_work();
    if (work) (void)sched_.step();  // a failed pass ends its sequences with an error event
    flush_events();
    heartbeat();
    if (stopping_ && waiting_.empty() && receiver_.empty() && !sched_.has_work()) break;
    // Idle: poll for the next message, sleeping longer the longer nothing comes.
    idle_polls = work || !receiver_.empty() ? 0 : idle_polls + 1;
    if (idle_polls > 0) std::this_thread::sleep_for(std::chrono::microseconds(idle_polls < 100 ? 200 : 2000));
  }
  HandoffMessage bye;
  bye.kind = HandoffMessage::Kind::Stopped;
  link_.send(router_, bye.encode());
  link_.progress();
  return Status::Ok();
}

// The router's messages, then the prefill ranks' (blocks, the last row, or the end).
Status DecodeRole::receive() {
  while (auto raw = link_.receive(router_)) {
    heard_at_ = now();
    auto m = HandoffMessage::decode(raw->bytes);
    if (!m.ok())
      return make_error("decode rank {}: the router (rank {}) sent a message that does not parse ({})", link_.rank(), router_,
                        m.error().message);
    handle_router(m.value());
  }
  for (int p = 1; p <= opts_.n_prefill; p++)
    while (auto raw = link_.receive(p)) {
      auto m = HandoffMessage::decode(raw->bytes);
      if (!m.ok())  // the stream from that rank is out of step: the router will hear it too
        return make_error("decode rank {}: prefill rank {} sent a message that does not parse ({})", link_.rank(), p,
                          m.error().message);
      receiver_.handle(p, m.value());
    }
  return Status::Ok();
}

void DecodeRole::handle_router(const HandoffMessage& m) {
  using K = HandoffMessage::Kind;
  switch (m.kind) {
    case K::Decode: return add(m);
    case K::Cancel: return cancel(m.id);
    case K::Ended: return receiver_.abandon(m.id);  // its prompt never went to a prefill rank
    case K::PeerDown: return receiver_.fail_from((int)m.peer, m.error);
    case K::Stop:
      stopping_ = true;
      for (Waiting& w : waiting_) sched_.drop_prepared(*w.seq, FinishReason::Cancelled, "the server is shutting down");
      waiting_.clear();
      receiver_.end_all();
      for (const auto& [key, local] : local_of_) sched_.cancel(local);
      return;
    default: return;  // a heartbeat: heard_at_ is enough
  }
}

void DecodeRole::add(const HandoffMessage& m) {
  const int64_t key = m.id;
  auto fail = [&](const std::string& why) {
    SeqEvent e;
    e.finish = FinishReason::Error;
    e.error = fmt::format("decode rank {}: {}", link_.rank(), why);
    on_event(key, e);
  };
  auto p = decode_request(m.request);
  if (!p.ok()) return fail(p.error().message);
  auto s = sched_.prepare(std::move(p.value()), [this, key](const SeqEvent& e) { return on_event(key, e), true; });
  if (!s.ok()) return fail(s.error().message);  // the router checked it against its own pool: the ranks differ
  local_of_[key] = s.value()->id;
  waiting_.push_back({key, (int)m.peer, std::move(s.value()), now()});
  reserve_waiting();
}

void DecodeRole::cancel(int64_t key) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if (it->key == key) {
      sched_.drop_prepared(*it->seq, FinishReason::Cancelled);
      waiting_.erase(it);
      return;
    }
  if (receiver_.cancel(key)) return;
  if (auto it = local_of_.find(key); it != local_of_.end()) sched_.cancel(it->second);
}

// In arrival order, each waiting request's blocks for its whole prompt (its own prefix
// cache's first); the router learns from which block on the prefill rank must send.
void DecodeRole::reserve_waiting() {
  while (!waiting_.empty()) {
    Waiting& w = waiting_.front();
    Scheduler::Seq& s = *w.seq;
    const int64_t n = (int64_t)s.tokens.size();
    const int64_t cached = s.kv.match_prefix(std::span<const int32_t>(s.tokens).first((size_t)n - 1));
    if (!s.kv.grow_to(n, cached)) {
      s.kv.release();
      return;  // blocks come back as running sequences finish
    }
    HandoffMessage r;
    r.kind = HandoffMessage::Kind::Reserved;
    r.id = w.key;
    r.first_block = cached / pool_.block_tokens();
    link_.send(router_, r.encode());
    receiver_.expect(w.key, std::move(w.seq), w.prefill_rank, now() - w.since);
    waiting_.pop_front();
  }
}

void DecodeRole::on_event(int64_t key, const SeqEvent& e) {
  auto [it, fresh] = outbox_.try_emplace(key);
  if (fresh) it->second.kind = HandoffMessage::Kind::Events, it->second.id = key;
  append_event(it->second, e);
  if (e.finish != FinishReason::None) local_of_.erase(key);
}

// One Events message per request that reported anything since the last flush; a request's
// first carries its hand-off's timing (the router's TTFT parts).
void DecodeRole::flush_events() {
  for (auto& [key, m] : outbox_) {
    if (auto t = timing_.find(key); t != timing_.end()) {
      m.queue_s = t->second.queue_s, m.prefill_s = t->second.prefill_s;
      m.transfer_s = t->second.transfer_s, m.stream_s = t->second.stream_s, m.n_blocks = t->second.blocks;
      m.handoffs = 1;
      timing_.erase(t);
    }
    link_.send(router_, m.encode());
  }
  outbox_.clear();
}

void DecodeRole::heartbeat() {
  if (now() - heartbeat_at_ < opts_.heartbeat_s) return;
  HandoffMessage hb;
  hb.kind = HandoffMessage::Kind::Heartbeat;
  hb.used_blocks = pool_.used_blocks();
  hb.total_blocks = pool_.n_blocks();
  hb.running = (int64_t)(sched_.n_running() + sched_.n_waiting() + receiver_.size() + waiting_.size());
  hb.blocks_sent = receiver_.stats().blocks_received;
  hb.bytes_sent = receiver_.stats().bytes_received;
  hb.handoffs = receiver_.stats().handoffs;
  hb.busy_s = sched_.stats().pass_s;
  link_.send(router_, hb.encode());
  heartbeat_at_ = now();
}

}  // namespace tandem
