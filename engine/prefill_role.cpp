#include "engine/prefill_role.h"

#include <algorithm>

#include <fmt/core.h>

namespace tandem {

PrefillRole::PrefillRole(Model& model, BlockPool& pool, PeerLink& link, SchedulerOptions so,
                         const DisaggregationOptions& o, int router)
    : model_(model),
      pool_(pool),
      link_(link),
      opts_(o),
      router_(router),
      sched_(model, pool, [&] {
        so.on_computed = [this, then = so.on_computed](int64_t id, const BlockTable& kv, int64_t n) {
          send_blocks(id, kv, n);
          if (then) then(id, kv, n);
        };
        so.speculative = {};  // nothing is decoded here
        so.draft_model = {};
        return so;
      }()) {}

PrefillRole::~PrefillRole() {
  quit_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

double PrefillRole::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

Status PrefillRole::run() {
  link_.send(router_, HandoffMessage::hello((int64_t)pool_.block_bytes(), pool_.n_blocks()).encode());
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
  heard_at_ = now();
  int idle_polls = 0;
  for (;;) {
    while (auto raw = link_.receive(router_)) {
      heard_at_ = now();
      auto m = HandoffMessage::decode(raw->bytes);
      if (!m.ok())
        return make_error("prefill rank {}: the router (rank {}) sent a message that does not parse ({})", link_.rank(), router_,
                          m.error().message);
      handle(m.value());
    }
    if (now() - heard_at_ > opts_.peer_timeout_s)
      return make_error("prefill rank {}: the router (rank {}) sent nothing for {:.0f} s: it died or stopped answering",
                        link_.rank(), router_, opts_.peer_timeout_s);
    const bool work = sched_.has_work();
    if (work) {
      step_started_ = now();
      (void)sched_.step();  // a failed pass ends its sequences with an error event (Ended)
    }
    reap_sends();
    used_blocks_ = pool_.used_blocks();
    busy_s_ = sched_.stats().pass_s;
    if (stopping_ && !sched_.has_work() && in_flight_.empty()) break;
    // Idle: poll for the router's next message, sleeping longer the longer nothing comes.
    idle_polls = work || !in_flight_.empty() ? 0 : idle_polls + 1;
    if (idle_polls > 0) std::this_thread::sleep_for(std::chrono::microseconds(idle_polls < 100 ? 200 : 2000));
  }
  HandoffMessage bye;
  bye.kind = HandoffMessage::Kind::Stopped;
  link_.send(router_, bye.encode());
  quit_ = true;
  heartbeat_.join();
  link_.progress();
  return Status::Ok();
}

void PrefillRole::handle(const HandoffMessage& m) {
  switch (m.kind) {
    case HandoffMessage::Kind::Prefill: return add(m);
    case HandoffMessage::Kind::Cancel:
      if (auto it = local_of_.find(m.id); it != local_of_.end()) sched_.cancel(it->second);
      return;
    case HandoffMessage::Kind::Stop:
      stopping_ = true;
      for (const auto& [router_id, local] : local_of_) sched_.cancel(local);
      return;
    default: return;  // a heartbeat: heard_at_ is enough
  }
}

void PrefillRole::add(const HandoffMessage& m) {
  RequestParams p;
  p.prompt = m.tokens;
  p.max_tokens = 0;
  p.prefill_only = true;
  p.cache_scope = m.cache_scope;
  p.tenant = m.tenant;
  auto local = std::make_shared<int64_t>(0);
  auto id = sched_.add(std::move(p), [this, local](const SeqEvent& e) { return on_event(*local, e), true; });
  if (!id.ok()) {  // the router checked the request against its own pool: a mismatch of the ranks
    HandoffMessage ended;
    ended.kind = HandoffMessage::Kind::Ended;
    ended.id = m.id;
    ended.error = fmt::format("prefill rank {}: {}", link_.rank(), id.error().message);
    link_.send((int)m.peer, ended.encode());
    if (m.peer != router_) link_.send(router_, ended.encode());
    return;
  }
  *local = id.value();
  jobs_[id.value()] = Job{m.id, (int)m.peer, (int64_t)m.tokens.size(), m.first_block, 0, now(), -1};
  local_of_[m.id] = id.value();
  queued_tokens_ += (int64_t)m.tokens.size();
}

void PrefillRole::on_event(int64_t local_id, const SeqEvent& e) {
  if (e.finish == FinishReason::None) return;
  auto it = jobs_.find(local_id);
  if (it == jobs_.end()) return;
  const Job& j = it->second;
  HandoffMessage m;
  m.id = j.router_id;
  if (e.finish == FinishReason::Stop) {
    m.kind = HandoffMessage::Kind::Done;
    m.n_cached = e.n_cached;
    const double started = j.started_at >= 0 ? j.started_at : step_started_;
    m.queue_s = std::max(0.0, started - j.added_at);
    m.prefill_s = now() - started;
    m.logits = e.last_logits;
  } else {
    m.kind = HandoffMessage::Kind::Ended;
    m.error = e.finish == FinishReason::Cancelled ? "" : fmt::format("prefill rank {}: {}", link_.rank(), e.error);
  }
  link_.send(j.decode_rank, m.encode());
  if (j.decode_rank != router_) {  // the router counts the rank's load and times the request
    if (m.kind == HandoffMessage::Kind::Done) m.kind = HandoffMessage::Kind::Computed, m.logits.clear();
    link_.send(router_, m.encode());
  }
  queued_tokens_ -= j.n_prompt;
  local_of_.erase(j.router_id);
  jobs_.erase(it);
}

// The blocks this pass finished: every full one, and the last partial one once the whole
// prompt is in. Each is held (a reference) until its payload has left, so neither a
// preemption nor the sequence's end hands it to another sequence while MPI still reads it.
void PrefillRole::send_blocks(int64_t local_id, const BlockTable& kv, int64_t n_computed) {
  auto it = jobs_.find(local_id);
  if (it == jobs_.end()) return;
  Job& j = it->second;
  if (j.started_at < 0) j.started_at = step_started_;
  const int64_t B = pool_.block_tokens();
  const int64_t upto = n_computed >= j.n_prompt ? (j.n_prompt + B - 1) / B : n_computed / B;
  const int64_t from = std::max(j.next_block, j.skip_blocks);
  if (upto <= from) return;
  HandoffMessage m;
  m.kind = HandoffMessage::Kind::Blocks;
  m.id = j.router_id;
  m.first_block = from;
  m.n_blocks = upto - from;
  link_.send(j.decode_rank, m.encode());
  const std::vector<int32_t>& table = kv.tables()[0];
  for (int64_t k = from; k < upto; k++) {
    const int32_t b = table[(size_t)k];
    pool_.retain(b);
    const uint8_t* data = pool_.store().data + (size_t)b * pool_.block_bytes();
    in_flight_.push_back({link_.send_payload(j.decode_rank, data, pool_.block_bytes()), b});
    blocks_sent_++, bytes_sent_ += (int64_t)pool_.block_bytes();
  }
  j.next_block = upto;
  blocks_sent_now_ = blocks_sent_, bytes_sent_now_ = bytes_sent_;
  sending_ = true;
}

void PrefillRole::reap_sends() {
  std::erase_if(in_flight_, [&](const InFlight& f) {
    if (!link_.done(f.handle)) return false;
    pool_.release(f.block);
    return true;
  });
  sending_ = !in_flight_.empty();
}

HandoffMessage PrefillRole::load_report() const {
  HandoffMessage m;
  m.kind = HandoffMessage::Kind::Heartbeat;
  m.used_blocks = used_blocks_;
  m.total_blocks = pool_.n_blocks();
  m.queued_tokens = queued_tokens_;
  m.blocks_sent = blocks_sent_now_;
  m.bytes_sent = bytes_sent_now_;
  m.busy_s = busy_s_;
  return m;
}

// The router hears from this rank even while a long chunk's pass runs; and MPI moves the
// blocks in flight along while it does (Open MPI progresses every request in any call).
void PrefillRole::heartbeat_loop() {
  double last = -1e9;
  while (!quit_) {
    if (now() - last >= opts_.heartbeat_s) {
      link_.send(router_, load_report().encode());
      last = now();
    } else {
      link_.progress();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sending_ ? 1 : 20));
  }
}

}  // namespace tandem
