#include "engine/decode_router.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include <fmt/core.h>

#include "engine/scheduler_seq.h"

namespace tandem {

DecodeRouter::DecodeRouter(Scheduler& decode, PeerLink& link, const DisaggregationOptions& o)
    : decode_(decode), pool_(decode.pool_for_handoff()), link_(link), opts_(o), receiver_(decode, link) {
  for (int r = 1; r <= o.n_prefill; r++) {
    Rank rk;
    rk.state.rank = r;
    ranks_.push_back(std::move(rk));
  }
  for (int r = o.n_prefill + 1; r < o.n_prefill + o.n_decode; r++) {
    Decoder d;
    d.state.rank = r;
    decoders_.push_back(std::move(d));
  }
  picked_at_.assign((size_t)o.n_decode, 0);
  receiver_.on_admitted = [this](int64_t, const HandoffTiming& t) {
    if (on_handoff) on_handoff(t);
  };
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
  if (const int d = choose_decoder(); d != 0) {
    route_remote(std::move(s.value()), *decoder(d));
    return id;
  }
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
  if (auto it = remote_.find(id); it != remote_.end()) {
    end_remote(id, it->second, FinishReason::Cancelled, "");
    return true;
  }
  if (!receiver_.has(id)) return false;
  if (auto p = prefilling_.find(id); p != prefilling_.end() && p->second.sent) {
    HandoffMessage m;
    m.kind = HandoffMessage::Kind::Cancel;
    m.id = id;
    send(p->second.prefill_rank, m);
  }
  receiver_.cancel(id);
  return true;
}

void DecodeRouter::abort_all(const std::string& why) {
  for (auto& s : waiting_) decode_.drop_prepared(*s, FinishReason::Error, why);
  waiting_.clear();
  submitted_at_.clear();
  HandoffMessage cancel;
  cancel.kind = HandoffMessage::Kind::Cancel;
  for (const auto& [id, p] : prefilling_)
    if (p.sent && p.decode_rank == 0 && ranks_[(size_t)p.prefill_rank - 1].state.up) cancel.id = id, send(p.prefill_rank, cancel);
  receiver_.end_all(FinishReason::Error, why);
  for (auto& [id, rm] : remote_) end_remote(id, rm, FinishReason::Error, why);
}

void DecodeRouter::poll() {
  for (Rank& r : ranks_)
    if (r.state.up) receive_from(r);
  for (Decoder& d : decoders_)
    if (d.state.up) receive_from(d);
  receiver_.settle(!stopped_);
  check_silence();
  if (!stopped_) dispatch_waiting();
  if (now() - heartbeat_at_ >= opts_.heartbeat_s) {
    HandoffMessage hb;
    for (const Rank& r : ranks_)
      if (r.state.up) send(r.state.rank, hb);
    for (const Decoder& d : decoders_)
      if (d.state.up) send(d.state.rank, hb);
    heartbeat_at_ = now();
  }
  publish_stats();
}

template <class Peer>
void DecodeRouter::receive_from(Peer& p) {
  while (auto raw = link_.receive(p.state.rank)) {
    p.heard_at = now();
    auto m = HandoffMessage::decode(raw->bytes);
    if (!m.ok())
      return mark_down(p, fmt::format("{} rank {} sent a message that does not parse ({})", role_of(p), p.state.rank,
                                      m.error().message));
    handle(p, m.value());
    if (!p.state.up) return;
  }
}

template <class Peer>
void DecodeRouter::check_hello(Peer& p, const HandoffMessage& m) {
  p.state.total_blocks = m.total_blocks;
  if (m.block_bytes != (int64_t)pool_.block_bytes())
    mark_down(p, fmt::format("{} rank {}'s KV blocks are {} bytes, rank 0's {}: start every rank with the same "
                             "--kv-dtype and --block-tokens", role_of(p), p.state.rank, m.block_bytes, pool_.block_bytes()));
}
template void DecodeRouter::check_hello(Decoder&, const HandoffMessage&);  // decode_router_remote.cpp's

void DecodeRouter::handle(Rank& r, const HandoffMessage& m) {
  using K = HandoffMessage::Kind;
  switch (m.kind) {
    case K::Hello: return check_hello(r, m);
    case K::Heartbeat:
      r.state.used_blocks = m.used_blocks, r.state.total_blocks = m.total_blocks, r.state.queued_tokens = m.queued_tokens;
      r.state.blocks_sent = m.blocks_sent, r.state.bytes_sent = m.bytes_sent, r.state.busy_s = m.busy_s;
      return;
    case K::Blocks: return receiver_.handle(r.state.rank, m);
    case K::Done:
    case K::Ended:
      receiver_.handle(r.state.rank, m);
      return prompt_done(m.id, r.state.rank);
    case K::Computed: return prompt_done(m.id, r.state.rank);
    case K::Stopped: r.stopped = true; return;
    default: return;
  }
}

// The prefill rank is done with `id` (computed, cancelled or failed): its tokens no longer
// count against the rank.
void DecodeRouter::prompt_done(int64_t id, int prefill_rank) {
  auto it = prefilling_.find(id);
  if (it == prefilling_.end() || it->second.prefill_rank != prefill_rank) return;
  ranks_[(size_t)prefill_rank - 1].state.routed_tokens -= it->second.n_prompt;
  prefilling_.erase(it);
}

void DecodeRouter::check_silence() {
  for (Rank& r : ranks_)
    if (r.state.up && !r.stopped && now() - r.heard_at > opts_.peer_timeout_s)
      mark_down(r, fmt::format("prefill rank {} sent nothing for {:.0f} s: it died or stopped answering", r.state.rank,
                               opts_.peer_timeout_s));
  for (Decoder& d : decoders_)
    if (d.state.up && !d.stopped && now() - d.heard_at > opts_.peer_timeout_s)
      mark_down(d, fmt::format("decode rank {} sent nothing for {:.0f} s: it died or stopped answering", d.state.rank,
                               opts_.peer_timeout_s));
}

// Its requests fail with `why`, here and on the other decode ranks (which also give up the
// blocks it was sending; a receive that cannot be cancelled keeps its blocks for good).
void DecodeRouter::mark_down(Rank& r, const std::string& why) {
  r.state.up = false;
  r.state.why_down = why;
  std::fprintf(stderr, "tandem serve: %s; its requests fail, the other prefill ranks take the next ones\n", why.c_str());
  for (auto it = prefilling_.begin(); it != prefilling_.end();) {
    if (it->second.prefill_rank != r.state.rank) {
      ++it;
      continue;
    }
    failed_requests_++;
    if (auto rm = remote_.find(it->first); rm != remote_.end()) end_remote(it->first, rm->second, FinishReason::Error, why);
    it = prefilling_.erase(it);
  }
  receiver_.fail_from(r.state.rank, why);
  HandoffMessage down;
  down.kind = HandoffMessage::Kind::PeerDown;
  down.peer = r.state.rank;
  down.error = why;
  for (const Decoder& d : decoders_)
    if (d.state.up) send(d.state.rank, down);
  r.state.routed_tokens = 0;
}

void DecodeRouter::dispatch_waiting() {
  while (!waiting_.empty()) {
    if (std::none_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.state.up; })) {
      for (auto& s : waiting_) decode_.drop_prepared(*s, FinishReason::Error, "no prefill rank is up"), failed_requests_++;
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
  m.peer = 0;  // this rank decodes it
  send(r->state.rank, m);
  note_routed(*r, hashes, n);
  prefilling_[m.id] = {r->state.rank, 0, n, true};
  const double submitted = submitted_at_.count(m.id) ? submitted_at_[m.id] : now();
  submitted_at_.erase(m.id);
  receiver_.expect(m.id, std::move(s), r->state.rank, now() - submitted);
  return true;
}

// The least loaded among the up ranks holding the longest run of the prompt's blocks (as
// routed there lately: what its prefix cache most likely still holds); of equals, the one
// chosen longest ago, so that idle ranks take turns.
DecodeRouter::Rank* DecodeRouter::choose_rank(const std::vector<uint64_t>& hashes) {
  Rank* best = nullptr;
  size_t best_hit = 0;
  for (Rank& r : ranks_) {
    if (!r.state.up) continue;
    size_t hit = 0;
    while (hit < hashes.size() && r.recent_blocks.count(hashes[hit])) hit++;
    if (!best || hit > best_hit ||
        (hit == best_hit && std::pair(r.state.routed_tokens, r.picked_at) < std::pair(best->state.routed_tokens, best->picked_at)))
      best = &r, best_hit = hit;
  }
  return best;
}

void DecodeRouter::note_routed(Rank& r, const std::vector<uint64_t>& hashes, int64_t n) {
  r.state.routed_tokens += n;
  r.picked_at = ++tick_;
  for (uint64_t hsh : hashes) r.recent_blocks[hsh] = ++tick_;
  if (r.recent_blocks.size() > (size_t)std::max<int64_t>(1024, 2 * r.state.total_blocks))
    std::erase_if(r.recent_blocks, [&](const auto& e) { return e.second < tick_ - (int64_t)r.recent_blocks.size() / 2; });
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
  receiver_.end_all();
  for (auto& [id, rm] : remote_) end_remote(id, rm, FinishReason::Cancelled, "");
  HandoffMessage stop;
  stop.kind = HandoffMessage::Kind::Stop;
  for (const Rank& r : ranks_)
    if (r.state.up) send(r.state.rank, stop);
  for (const Decoder& d : decoders_)
    if (d.state.up) send(d.state.rank, stop);
  // Until every live rank has stopped and each block on its way has landed (or time is up).
  Timer waited;
  auto settled = [&] {
    return receiver_.empty() && std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.state.up || r.stopped; }) &&
           std::all_of(decoders_.begin(), decoders_.end(), [](const Decoder& d) { return !d.state.up || d.stopped; });
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
  RouterStats s;
  const ReceiverStats& rs = receiver_.stats();
  s.handoffs = rs.handoffs, s.blocks_received = rs.blocks_received, s.bytes_received = rs.bytes_received;
  s.failed_requests = failed_requests_;
  s.waiting = (int64_t)waiting_.size();
  s.in_flight = (int64_t)prefilling_.size();
  for (const Rank& r : ranks_) s.ranks.push_back(r.state);
  DecodeRankState self;
  self.requests = (int64_t)(decode_.n_running() + decode_.n_waiting() + waiting_.size() + receiver_.size());
  self.used_blocks = pool_.used_blocks(), self.total_blocks = pool_.n_blocks();
  self.blocks_received = rs.blocks_received, self.bytes_received = rs.bytes_received, self.handoffs = rs.handoffs;
  self.busy_s = decode_.stats().pass_s;
  self.routed = routed_here_;
  s.decoders.push_back(self);
  for (const Decoder& d : decoders_) s.decoders.push_back(d.state);
  std::lock_guard<std::mutex> l(stats_mu_);
  published_ = std::move(s);
}

}  // namespace tandem
