// The router's side of decode ranks other than rank 0 (engine/decode_router.h): choosing the
// decode rank, sending it the request, sending the prompt to the prefill rank once that rank
// has reserved its blocks, handing its tokens to the request's callback, cancellations, and a
// decode rank that falls silent.
#include <algorithm>
#include <cstdio>
#include <tuple>

#include <fmt/core.h>

#include "engine/decode_router.h"
#include "engine/handoff_request.h"
#include "engine/scheduler_seq.h"

namespace tandem {

DecodeRouter::Decoder* DecodeRouter::decoder(int rank) {
  for (Decoder& d : decoders_)
    if (d.state.rank == rank) return &d;
  return nullptr;
}

// The decode rank with the fewest requests, then the fewest KV blocks in use, then the one
// chosen longest ago (so that equal ranks take turns): 0 for this rank. Another rank's blocks
// are counted from its requests' tokens as the router has seen them (its heartbeat's would lag).
int DecodeRouter::choose_decoder() {
  std::vector<int64_t> blocks(decoders_.size() + 1, 0);
  for (const auto& [id, rm] : remote_)
    if (!rm.ended) blocks[(size_t)(rm.decode_rank - opts_.n_prefill)] += (rm.n_tokens + pool_.block_tokens() - 1) / pool_.block_tokens();
  struct Load {
    int rank;
    int64_t requests, used_blocks, picked_at;
    auto key() const { return std::tuple(requests, used_blocks, picked_at); }
  };
  Load best{0, (int64_t)(decode_.n_running() + decode_.n_waiting() + waiting_.size() + receiver_.size()),
            pool_.used_blocks(), picked_at_[0]};
  for (size_t i = 0; i < decoders_.size(); i++) {
    const Decoder& d = decoders_[i];
    if (!d.state.up) continue;
    const Load l{d.state.rank, d.state.requests, blocks[i + 1], picked_at_[i + 1]};
    if (l.key() < best.key()) best = l;
  }
  picked_at_[best.rank == 0 ? 0 : (size_t)(best.rank - opts_.n_prefill)] = ++tick_;
  if (best.rank == 0) routed_here_++;
  return best.rank;
}

// The request to decode rank `d`, which reserves its blocks and answers Reserved; the prefill
// rank is chosen now (its tokens count against it from here).
void DecodeRouter::route_remote(std::unique_ptr<Scheduler::Seq> s, Decoder& d) {
  const std::vector<uint64_t> hashes = prefix_hashes(*s);
  Rank* r = choose_rank(hashes);
  const int64_t n = (int64_t)s->tokens.size();
  HandoffMessage m;
  m.kind = HandoffMessage::Kind::Decode;
  m.id = s->id;
  m.peer = r->state.rank;
  m.request = encode_request(s->params);
  send(d.state.rank, m);
  note_routed(*r, hashes, n);
  prefilling_[m.id] = {r->state.rank, d.state.rank, n, false};
  d.state.requests++, d.state.routed++;
  Remote rm;
  rm.decode_rank = d.state.rank;
  rm.cb = std::move(s->cb);
  rm.prompt = s->tokens;
  rm.n_tokens = n;
  rm.cache_scope = s->params.cache_scope;
  rm.tenant = s->params.tenant;
  remote_.emplace(m.id, std::move(rm));
  // The prepared sequence was only the check and the id: the decode rank makes its own.
}

void DecodeRouter::handle(Decoder& d, const HandoffMessage& m) {
  using K = HandoffMessage::Kind;
  switch (m.kind) {
    case K::Hello: return check_hello(d, m);
    case K::Heartbeat:
      d.state.used_blocks = m.used_blocks, d.state.total_blocks = m.total_blocks, d.state.busy_s = m.busy_s;
      d.state.blocks_received = m.blocks_sent, d.state.bytes_received = m.bytes_sent, d.state.handoffs = m.handoffs;
      return;
    case K::Reserved: return on_reserved(d, m);
    case K::Events: return on_events(d, m);
    case K::Stopped: d.stopped = true; return;
    default: return;
  }
}

// The decode rank holds the request's blocks: its prompt goes to the prefill rank chosen for it,
// which sends every block from first_block on to that decode rank. A request that ended
// meanwhile (or whose prefill rank died) never goes: the decode rank frees its blocks.
void DecodeRouter::on_reserved(Decoder& d, const HandoffMessage& m) {
  auto rm = remote_.find(m.id);
  auto p = prefilling_.find(m.id);
  const bool go = rm != remote_.end() && !rm->second.ended && rm->second.decode_rank == d.state.rank && p != prefilling_.end() &&
                  !stopped_ && ranks_[(size_t)p->second.prefill_rank - 1].state.up;
  if (!go) {
    HandoffMessage ended;
    ended.kind = HandoffMessage::Kind::Ended;
    ended.id = m.id;
    send(d.state.rank, ended);
    if (p != prefilling_.end() && !p->second.sent) prompt_done(m.id, p->second.prefill_rank);
    return;
  }
  HandoffMessage pre;
  pre.kind = HandoffMessage::Kind::Prefill;
  pre.id = m.id;
  pre.first_block = m.first_block;
  pre.tokens = rm->second.prompt;
  pre.cache_scope = rm->second.cache_scope;
  pre.tenant = rm->second.tenant;
  pre.peer = d.state.rank;
  send(p->second.prefill_rank, pre);
  p->second.sent = true;
}

// Each event goes to the request's callback as the scheduler's own would; one the callback
// refuses cancels the request there. The finish ends it here.
void DecodeRouter::on_events(Decoder& d, const HandoffMessage& m) {
  auto it = remote_.find(m.id);
  if (it == remote_.end() || it->second.decode_rank != d.state.rank) return;
  Remote& rm = it->second;
  if (m.handoffs > 0 && on_handoff) {
    HandoffTiming t;
    t.queue_s = m.queue_s, t.prefill_s = m.prefill_s, t.transfer_s = m.transfer_s, t.stream_s = m.stream_s;
    t.blocks = m.n_blocks, t.bytes = m.n_blocks * (int64_t)pool_.block_bytes();
    on_handoff(t);
  }
  rm.n_tokens += (int64_t)m.ev_tokens.size();
  for (const SeqEvent& e : events_of(m)) {
    if (e.finish == FinishReason::None) {
      if (!rm.ended && !rm.cb(e)) end_remote(m.id, rm, FinishReason::Cancelled, "");
      continue;
    }
    if (!rm.ended) rm.ended = true, rm.cb(e);
    d.state.requests--;
    if (auto p = prefilling_.find(m.id); p != prefilling_.end() && !p->second.sent) prompt_done(m.id, p->second.prefill_rank);
    remote_.erase(it);
    return;
  }
}

// The request ends for its client now; the decode rank (and the prefill rank, while it still
// computes the prompt) are told, and its finish from there closes it here.
void DecodeRouter::end_remote(int64_t id, Remote& rm, FinishReason why, const std::string& error) {
  if (rm.ended) return;
  rm.ended = true;
  HandoffMessage cancel;
  cancel.kind = HandoffMessage::Kind::Cancel;
  cancel.id = id;
  if (Decoder* d = decoder(rm.decode_rank); d && d->state.up) send(d->state.rank, cancel);
  if (auto p = prefilling_.find(id); p != prefilling_.end() && p->second.sent && ranks_[(size_t)p->second.prefill_rank - 1].state.up)
    send(p->second.prefill_rank, cancel);
  SeqEvent e;
  e.id = id;
  e.finish = why;
  e.error = error;
  e.n_prompt = (int)rm.prompt.size();
  rm.cb(e);
}

// Its requests fail with `why`; the prefill ranks stop computing their prompts.
void DecodeRouter::mark_down(Decoder& d, const std::string& why) {
  d.state.up = false;
  d.state.why_down = why;
  std::fprintf(stderr, "tandem serve: %s; its requests fail, the other decode ranks take the next ones\n", why.c_str());
  for (auto it = remote_.begin(); it != remote_.end();) {
    if (it->second.decode_rank != d.state.rank) {
      ++it;
      continue;
    }
    if (!it->second.ended) failed_requests_++;
    end_remote(it->first, it->second, FinishReason::Error, why);
    if (auto p = prefilling_.find(it->first); p != prefilling_.end() && !p->second.sent) prompt_done(it->first, p->second.prefill_rank);
    it = remote_.erase(it);
  }
  d.state.requests = 0;
}

}  // namespace tandem
