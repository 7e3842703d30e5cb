#include "engine/decode_router.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include <fmt/core.h>

#include "engine/scheduler_seq.h"

namespace tandem {

DecodeRouter::DecodeRouter(Scheduler& decode, PeerLink& link, const DisaggregationOptions& o)
    : decode_(decode), pool_(decode.pool_for_handoff()), link_(link), opts_(o) {
  for (int r = 1; r <= o.n_prefill; r++) {
    Rank rk;
    rk.state.rank = r;
    ranks_.push_back(std::move(rk));
  }
  publish_stats();
}

DecodeRouter::~DecodeRouter() { stop(); }

Result<int64_t> DecodeRouter::submit(RequestParams p, SeqCallback cb) {
  if (std::none_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.state.up; }))
    return make_error("no prefill rank is up (every one of the {} failed): this server cannot take prompts until it restarts",
                      ranks_.size());
  auto s = decode_.prepare(std::move(p), std::move(cb));
  if (!s.ok()) return s.error();
  const int64_t id = s.value()->id;
  submitted_at_[id] = now();
  waiting_.push_back(std::move(s.value()));
  dispatch_waiting();
  return id;
}

bool DecodeRouter::cancel(int64_t id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if ((*it)->id == id) {
      decode_.drop_prepared(**it, FinishReason::Cancelled);
      submitted_at_.erase(id);
      waiting_.erase(it);
      return true;
    }
  auto it = handoffs_.find(id);
  if (it == handoffs_.end()) return false;
  Handoff& h = it->second;
  if (h.seq) {
    HandoffMessage m;
    m.kind = HandoffMessage::Kind::Cancel;
    m.id = id;
    send(h.rank, m);
    end_here(h, FinishReason::Cancelled, "");
  }
  return true;
}

// The request ends for its client now; its blocks stay held until the prefill rank has sent
// its last block (Done or Ended) and every receive into them has landed.
void DecodeRouter::end_here(Handoff& h, FinishReason why, const std::string& error) {
  if (!h.seq) return;
  h.held = std::move(h.seq->kv);
  decode_.drop_prepared(*h.seq, why, error);
  h.seq.reset();
  if (why == FinishReason::Error) counters_.failed_requests++;
}

void DecodeRouter::poll() {
  for (Rank& r : ranks_)
    if (r.state.up) receive_from(r);
  finish_handoffs();
  check_silence();
  if (!stopped_) dispatch_waiting();
  if (now() - heartbeat_at_ >= opts_.heartbeat_s) {
    HandoffMessage hb;
    for (const Rank& r : ranks_)
      if (r.state.up) send(r.state.rank, hb);
    heartbeat_at_ = now();
  }
  publish_stats();
}

void DecodeRouter::receive_from(Rank& r) {
  while (auto raw = link_.receive(r.state.rank)) {
    r.heard_at = now();
    auto m = HandoffMessage::decode(raw->bytes);
    if (!m.ok()) return mark_down(r, fmt::format("prefill rank {} sent a message that does not parse ({})", r.state.rank, m.error().message));
    handle(r, m.value());
    if (!r.state.up) return;
  }
}

void DecodeRouter::handle(Rank& r, const HandoffMessage& m) {
  using K = HandoffMessage::Kind;
  auto it = handoffs_.find(m.id);
  Handoff* h = it != handoffs_.end() && it->second.rank == r.state.rank ? &it->second : nullptr;
  switch (m.kind) {
    case K::Hello:
      r.state.total_blocks = m.total_blocks;
      if (m.block_bytes != (int64_t)pool_.block_bytes())
        mark_down(r, fmt::format("prefill rank {}'s KV blocks are {} bytes, this decode rank's {}: start every rank with "
                                 "the same --kv-dtype and --block-tokens", r.state.rank, m.block_bytes, pool_.block_bytes()));
      return;
    case K::Heartbeat:
      r.state.used_blocks = m.used_blocks, r.state.total_blocks = m.total_blocks, r.state.queued_tokens = m.queued_tokens;
      r.state.blocks_sent = m.blocks_sent, r.state.bytes_sent = m.bytes_sent, r.state.busy_s = m.busy_s;
      return;
    case K::Blocks: return on_blocks(r, m);
    case K::Done:
      if (!h) return;
      h->prefill_done = true;
      h->last_row = m.logits;
      h->n_cached = m.n_cached, h->queue_s = m.queue_s, h->prefill_s = m.prefill_s;
      h->done_at = now();
      return;
    case K::Ended:
      if (!h) return;
      h->ended = true;
      end_here(*h, m.error.empty() ? FinishReason::Cancelled : FinishReason::Error, m.error);
      return;
    case K::Stopped: r.stopped = true; return;
    default: return;
  }
}

// Each announced block's payload is received into the block the request reserved for it, in
// the order the prefill rank sent them; one for a request no longer here lands in a scratch
// buffer, so the stream stays in step.
void DecodeRouter::on_blocks(Rank& r, const HandoffMessage& m) {
  auto it = handoffs_.find(m.id);
  Handoff* h = it != handoffs_.end() && it->second.rank == r.state.rank ? &it->second : nullptr;
  const size_t bytes = pool_.block_bytes();
  if (h && h->first_block_at < 0) h->first_block_at = now();
  for (int64_t k = m.first_block; k < m.first_block + m.n_blocks; k++) {
    const BlockTable* table = h ? (h->seq ? &h->seq->kv : &h->held) : nullptr;
    const bool mine = table && table->n_groups() > 0 && k < (int64_t)table->tables()[0].size();
    uint8_t* into = nullptr;
    if (mine) {
      into = pool_.store().data + (size_t)table->tables()[0][(size_t)k] * bytes;
    } else {
      discard_.resize(bytes);
      into = discard_.data();
    }
    const PeerLink::Handle recv = link_.receive_payload(r.state.rank, into, bytes);
    if (h) h->receives.push_back(recv), h->blocks++;
    counters_.blocks_received++, counters_.bytes_received += (int64_t)bytes;
  }
}

void DecodeRouter::finish_handoffs() {
  for (auto it = handoffs_.begin(); it != handoffs_.end();) {
    Handoff& h = it->second;
    std::erase_if(h.receives, [&](PeerLink::Handle x) { return link_.done(x); });
    const bool sender_done = h.prefill_done || h.ended;
    if (!sender_done || !h.receives.empty()) {
      ++it;
      continue;
    }
    Rank& r = ranks_[(size_t)h.rank - 1];
    r.state.routed_tokens -= h.n_prompt;
    if (h.seq && h.prefill_done && !stopped_) {
      HandoffTiming t;
      t.queue_s = (h.dispatched_at - h.submitted_at) + h.queue_s;
      t.prefill_s = h.prefill_s;
      t.transfer_s = std::max(0.0, now() - h.done_at);
      t.stream_s = h.first_block_at >= 0 ? now() - h.first_block_at : 0;
      t.blocks = h.blocks, t.bytes = h.blocks * (int64_t)pool_.block_bytes();
      counters_.handoffs++;
      if (on_handoff) on_handoff(t);
      decode_.admit_prefilled(std::move(h.seq), h.last_row, (int)h.n_cached);
    } else {
      end_here(h, FinishReason::Cancelled, "");
    }
    it = handoffs_.erase(it);  // `held` gives its blocks back
  }
}

void DecodeRouter::check_silence() {
  for (Rank& r : ranks_)
    if (r.state.up && !r.stopped && now() - r.heard_at > opts_.peer_timeout_s)
      mark_down(r, fmt::format("prefill rank {} sent nothing for {:.0f} s: it died or stopped answering", r.state.rank,
                               opts_.peer_timeout_s));
}

// Its requests fail with `why`; a receive that cannot be cancelled keeps its blocks forever
// (lost_), since the dead rank's bytes could still land in them.
void DecodeRouter::mark_down(Rank& r, const std::string& why) {
  r.state.up = false;
  r.state.why_down = why;
  std::fprintf(stderr, "tandem serve: %s; its requests fail, the other prefill ranks take the next ones\n", why.c_str());
  for (auto it = handoffs_.begin(); it != handoffs_.end();) {
    Handoff& h = it->second;
    if (h.rank != r.state.rank) {
      ++it;
      continue;
    }
    end_here(h, FinishReason::Error, why);
    const bool clean = std::all_of(h.receives.begin(), h.receives.end(), [&](PeerLink::Handle x) { return link_.cancel_receive(x); });
    if (!clean) lost_.push_back(std::move(h.held));
    it = handoffs_.erase(it);
  }
  r.state.routed_tokens = 0;
}

void DecodeRouter::dispatch_waiting() {
  while (!waiting_.empty()) {
    if (std::none_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.state.up; })) {
      for (auto& s : waiting_) decode_.drop_prepared(*s, FinishReason::Error, "no prefill rank is up"), counters_.failed_requests++;
      waiting_.clear();
      submitted_at_.clear();
      return;
    }
    if (!dispatch(waiting_.front())) return;  // no decode blocks yet: they come back as others finish
    waiting_.pop_front();
  }
}

// The decode pool's blocks for the whole prompt (its own prefix cache's first), then the
// prompt to the chosen prefill rank, which sends the blocks from the first one not cached here.
bool DecodeRouter::dispatch(std::unique_ptr<Scheduler::Seq>& s) {
  const std::vector<uint64_t> hashes = prefix_hashes(*s);
  Rank* r = choose_rank(hashes);
  const int64_t n = (int64_t)s->tokens.size();
  const int64_t cached = s->kv.match_prefix(std::span<const int32_t>(s->tokens).first((size_t)n - 1));
  if (!s->kv.grow_to(n, cached)) {
    s->kv.release();
    return false;
  }
  HandoffMessage m;
  m.kind = HandoffMessage::Kind::Prefill;
  m.id = s->id;
  m.first_block = cached / pool_.block_tokens();
  m.tokens = s->tokens;
  m.cache_scope = s->params.cache_scope;
  m.tenant = s->params.tenant;
  send(r->state.rank, m);
  r->state.routed_tokens += n;
  for (uint64_t hsh : hashes) r->recent_blocks[hsh] = ++tick_;
  if (r->recent_blocks.size() > (size_t)std::max<int64_t>(1024, 2 * r->state.total_blocks))
    std::erase_if(r->recent_blocks, [&](const auto& e) { return e.second < tick_ - (int64_t)r->recent_blocks.size() / 2; });
  Handoff h;
  h.rank = r->state.rank;
  h.n_prompt = n;
  h.dispatched_at = now();
  h.submitted_at = submitted_at_.count(m.id) ? submitted_at_[m.id] : h.dispatched_at;
  submitted_at_.erase(m.id);
  h.seq = std::move(s);
  handoffs_.emplace(m.id, std::move(h));
  return true;
}

// The least loaded among the up ranks holding the longest run of the prompt's blocks (as
// routed there lately: what its prefix cache most likely still holds).
DecodeRouter::Rank* DecodeRouter::choose_rank(const std::vector<uint64_t>& hashes) {
  Rank* best = nullptr;
  size_t best_hit = 0;
  for (Rank& r : ranks_) {
    if (!r.state.up) continue;
    size_t hit = 0;
    while (hit < hashes.size() && r.recent_blocks.count(hashes[hit])) hit++;
    if (!best || hit > best_hit || (hit == best_hit && r.state.routed_tokens < best->state.routed_tokens))
      best = &r, best_hit = hit;
  }
  return best;
}

std::vector<uint64_t> DecodeRouter::prefix_hashes(const Scheduler::Seq& s) const {
  std::vector<uint64_t> out;
  const int64_t B = pool_.block_tokens();
  uint64_t h = pool_.scope_root(s.params.cache_scope);
  for (int64_t k = 0; (k + 1) * B < (int64_t)s.tokens.size(); k++)
    out.push_back(h = pool_.chain_hash(h, std::span<const int32_t>(s.tokens).subspan((size_t)(k * B), (size_t)B)));
  return out;
}

void DecodeRouter::stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& s : waiting_) decode_.drop_prepared(*s, FinishReason::Cancelled, "the server is shutting down");
  waiting_.clear();
  submitted_at_.clear();
  for (auto& [id, h] : handoffs_) end_here(h, FinishReason::Cancelled, "");
  HandoffMessage stop;
  stop.kind = HandoffMessage::Kind::Stop;
  for (const Rank& r : ranks_)
    if (r.state.up) send(r.state.rank, stop);
  // Until every live rank has stopped and each block on its way has landed (or time is up).
  Timer waited;
  auto settled = [&] {
    return handoffs_.empty() && std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.state.up || r.stopped; });
  };
  while (!settled() && waited.seconds() < opts_.peer_timeout_s) {
    poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

RouterStats DecodeRouter::stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return published_;
}

void DecodeRouter::publish_stats() {
  RouterStats s = counters_;
  s.waiting = (int64_t)waiting_.size();
  s.in_flight = (int64_t)handoffs_.size();
  for (const Rank& r : ranks_) s.ranks.push_back(r.state);
  std::lock_guard<std::mutex> l(stats_mu_);
  published_ = std::move(s);
}

}  // namespace tandem
