#include "engine/handoff_receiver.h"

#include <algorithm>

#include "engine/scheduler_seq.h"

namespace tandem {

HandoffReceiver::HandoffReceiver(Scheduler& decode, PeerLink& link)
    : decode_(decode), pool_(decode.pool_for_handoff()), link_(link) {}

HandoffReceiver::~HandoffReceiver() = default;

void HandoffReceiver::expect(int64_t key, std::unique_ptr<Scheduler::Seq> seq, int from, double waited_s) {
  Handoff h;
  h.seq = std::move(seq);
  h.from = from;
  h.waited_s = waited_s;
  h.expected_at = now();
  handoffs_.insert_or_assign(key, std::move(h));
}

HandoffReceiver::Handoff* HandoffReceiver::find(int from, int64_t key) {
  auto it = handoffs_.find(key);
  return it != handoffs_.end() && it->second.from == from ? &it->second : nullptr;
}

void HandoffReceiver::handle(int from, const HandoffMessage& m) {
  using K = HandoffMessage::Kind;
  if (m.kind == K::Blocks) return on_blocks(from, m);
  Handoff* h = find(from, m.id);
  if (!h) return;
  if (m.kind == K::Done) {
    h->prefill_done = true;
    h->last_row = m.logits;
    h->n_cached = m.n_cached, h->queue_s = m.queue_s, h->prefill_s = m.prefill_s;
    h->done_at = now();
  } else if (m.kind == K::Ended) {
    h->ended = true;
    end_here(*h, m.error.empty() ? FinishReason::Cancelled : FinishReason::Error, m.error);
  }
}

// Each announced block's payload is received into the block the request reserved for it, in
// the order the prefill rank sent them; one for a request no longer here (or past its
// reservation) lands in a scratch buffer, so the stream stays in step.
void HandoffReceiver::on_blocks(int from, const HandoffMessage& m) {
  Handoff* h = find(from, m.id);
  const size_t bytes = pool_.block_bytes();
  if (h && h->first_block_at < 0) h->first_block_at = now();
  for (int64_t k = m.first_block; k < m.first_block + m.n_blocks; k++) {
    const BlockTable* table = h ? (h->seq ? &h->seq->kv : &h->held) : nullptr;
    const bool mine = table && table->n_groups() > 0 && k < (int64_t)table->tables()[0].size();
    uint8_t* into = nullptr;
    const int32_t block = mine ? table->tables()[0][(size_t)k] : -1;
    if (mine) {
      into = pool_.store().data + (size_t)block * bytes;
    } else {
      discard_.resize(bytes);
      into = discard_.data();
    }
    const PeerLink::Handle recv = link_.receive_payload(from, into, bytes);
    if (h) h->receives.push_back({recv, block}), h->blocks++;
    stats_.blocks_received++, stats_.bytes_received += (int64_t)bytes;
  }
}

// The request ends for its client now; its blocks stay held until the prefill rank has sent
// its last block (Done or Ended) and every receive into them has landed.
void HandoffReceiver::end_here(Handoff& h, FinishReason why, const std::string& error) {
  if (!h.seq) return;
  h.held = std::move(h.seq->kv);
  decode_.drop_prepared(*h.seq, why, error);
  h.seq.reset();
}

bool HandoffReceiver::cancel(int64_t key) {
  auto it = handoffs_.find(key);
  if (it == handoffs_.end()) return false;
  end_here(it->second, FinishReason::Cancelled, "");
  return true;
}

void HandoffReceiver::abandon(int64_t key) {
  auto it = handoffs_.find(key);
  if (it == handoffs_.end() || !it->second.receives.empty() || it->second.blocks > 0) return;
  end_here(it->second, FinishReason::Cancelled, "");
  handoffs_.erase(it);  // `held` gives its blocks back
}

void HandoffReceiver::settle(bool admit) {
  for (auto it = handoffs_.begin(); it != handoffs_.end();) {
    Handoff& h = it->second;
    std::erase_if(h.receives, [&](const Handoff::Receive& x) { return link_.done(x.handle); });
    if (!(h.prefill_done || h.ended) || !h.receives.empty()) {
      ++it;
      continue;
    }
    if (h.seq && h.prefill_done && admit) {
      HandoffTiming t;
      t.queue_s = h.waited_s + h.queue_s;
      t.prefill_s = h.prefill_s;
      t.transfer_s = std::max(0.0, now() - h.done_at);
      t.stream_s = h.first_block_at >= 0 ? now() - h.first_block_at : 0;
      t.blocks = h.blocks, t.bytes = h.blocks * (int64_t)pool_.block_bytes();
      stats_.handoffs++;
      if (on_admitted) on_admitted(it->first, t);
      decode_.admit_prefilled(std::move(h.seq), h.last_row, (int)h.n_cached);
    } else {
      end_here(h, FinishReason::Cancelled, "");
    }
    it = handoffs_.erase(it);  // `held` gives its blocks back
  }
}

void HandoffReceiver::fail_from(int rank, const std::string& why) {
  for (auto it = handoffs_.begin(); it != handoffs_.end();) {
    Handoff& h = it->second;
    if (h.from != rank) {
      ++it;
      continue;
    }
    end_here(h, FinishReason::Error, why);
    for (const Handoff::Receive& r : h.receives)
      if (!link_.cancel_receive(r.handle) && r.block >= 0) pool_.retain(r.block), lost_.push_back(r.block);
    it = handoffs_.erase(it);  // `held` gives back the rest
  }
}

void HandoffReceiver::end_all(FinishReason why, const std::string& error) {
  for (auto& [key, h] : handoffs_) end_here(h, why, error);
}

}  // namespace tandem
