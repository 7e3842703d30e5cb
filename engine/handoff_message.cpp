#include "engine/handoff_message.h"

#include <cmath>

#include "engine/handoff_codec.h"

namespace tandem {

namespace {

// One field list for both directions: what encode writes, decode reads, in the same order.
template <class Io, class Msg>
void fields(Io& io, Msg& m) {
  io.pod("id", m.id), io.pod("first_block", m.first_block), io.pod("n_blocks", m.n_blocks);
  io.array("tokens", m.tokens);
  io.text("cache_scope", m.cache_scope), io.text("tenant", m.tenant), io.text("error", m.error);
  io.pod("n_cached", m.n_cached), io.pod("queue_s", m.queue_s), io.pod("prefill_s", m.prefill_s);
  io.array("logits", m.logits);
  io.pod("block_bytes", m.block_bytes), io.pod("used_blocks", m.used_blocks), io.pod("total_blocks", m.total_blocks);
  io.pod("queued_tokens", m.queued_tokens);
  io.pod("blocks_sent", m.blocks_sent), io.pod("bytes_sent", m.bytes_sent), io.pod("busy_s", m.busy_s);
  io.pod("running", m.running), io.pod("handoffs", m.handoffs), io.pod("peer", m.peer);
  io.array("request", m.request);
  io.array("ev_tokens", m.ev_tokens), io.array("ev_top_n", m.ev_top_n), io.array("ev_top_ids", m.ev_top_ids);
  io.array("ev_logprobs", m.ev_logprobs), io.array("ev_top_logprobs", m.ev_top_logprobs);
  io.pod("finish", m.finish), io.pod("finish_flags", m.finish_flags);
  io.pod("n_prompt", m.n_prompt), io.pod("n_generated", m.n_generated), io.pod("n_preemptions", m.n_preemptions);
  io.pod("transfer_s", m.transfer_s), io.pod("stream_s", m.stream_s);
}

// An Events message's arrays agree: one logprob and one count of alternatives per token, as
// many alternatives as the counts say, a finish that is a FinishReason.
std::string check_events(const HandoffMessage& m) {
  const size_t n = m.ev_tokens.size();
  if (m.ev_logprobs.size() != n || m.ev_top_n.size() != n)
    return fmt::format("an Events message of {} tokens with {} logprobs and {} counts of alternatives", n, m.ev_logprobs.size(),
                       m.ev_top_n.size());
  uint64_t alternatives = 0;
  for (int32_t k : m.ev_top_n) {
    if (k < 0) return fmt::format("an Events message with {} alternatives for a token", k);
    alternatives += (uint64_t)k;
  }
  if (m.ev_top_ids.size() != alternatives || m.ev_top_logprobs.size() != alternatives)
    return fmt::format("an Events message counting {} alternatives but holding {} ids and {} logprobs", alternatives,
                       m.ev_top_ids.size(), m.ev_top_logprobs.size());
  if (m.finish > 4) return fmt::format("an Events message with finish reason {}", (int)m.finish);
  if (n == 0 && m.finish == 0) return "an Events message with no token and no finish";
  return "";
}

// Values no sender writes: a negative count or index, a time that is not a number.
std::string check_values(const HandoffMessage& m) {
  using K = HandoffMessage::Kind;
  const std::pair<const char*, int64_t> counts[] = {
      {"id", m.id},                     {"first_block", m.first_block}, {"n_blocks", m.n_blocks},
      {"n_cached", m.n_cached},         {"block_bytes", m.block_bytes}, {"used_blocks", m.used_blocks},
      {"total_blocks", m.total_blocks}, {"queued_tokens", m.queued_tokens}, {"blocks_sent", m.blocks_sent},
      {"bytes_sent", m.bytes_sent},     {"running", m.running},         {"handoffs", m.handoffs},
      {"peer", m.peer},                 {"n_prompt", m.n_prompt},       {"n_generated", m.n_generated},
      {"n_preemptions", m.n_preemptions}};
  for (const auto& [name, v] : counts)
    if (v < 0) return fmt::format("field '{}' is negative ({})", name, v);
  const std::pair<const char*, double> times[] = {{"queue_s", m.queue_s},       {"prefill_s", m.prefill_s}, {"busy_s", m.busy_s},
                                                  {"transfer_s", m.transfer_s}, {"stream_s", m.stream_s}};
  for (const auto& [name, v] : times)
    if (!std::isfinite(v) || v < 0) return fmt::format("field '{}' is not a time in seconds ({})", name, v);
  if (m.kind == K::Prefill && m.tokens.empty()) return "a Prefill message without a prompt";
  if (m.kind == K::Blocks && m.n_blocks == 0) return "a Blocks message announcing no block";
  if (m.kind == K::Done && m.logits.empty()) return "a Done message without the prompt's last logits row";
  if (m.kind == K::Hello && m.block_bytes == 0) return "a Hello message with blocks of 0 bytes";
  if (m.kind == K::Decode && m.request.empty()) return "a Decode message without its request";
  if (m.kind == K::Events) return check_events(m);
  return "";
}

}  // namespace

std::vector<uint8_t> HandoffMessage::encode() const {
  HandoffWriter w;
  w.pod("magic", kMagic);
  w.pod("kind", kind);
  fields(w, *this);
  return std::move(w.out);
}

Result<HandoffMessage> HandoffMessage::decode(std::span<const uint8_t> bytes) {
  HandoffMessage m;
  HandoffReader r{bytes, {}};
  uint32_t magic = 0;
  r.pod("magic", magic);
  if (r.ok() && magic != kMagic)
    return make_error("hand-off message of {} bytes: not one (it starts with {:#010x}, not {:#010x})", bytes.size(), magic, kMagic);
  r.pod("kind", m.kind);
  if (r.ok() && (m.kind < Kind::Prefill || m.kind > kLastKind))
    return make_error("hand-off message of {} bytes: unknown kind {}", bytes.size(), (int)m.kind);
  fields(r, m);
  if (!r.ok()) return make_error("hand-off message of {} bytes: {}", bytes.size(), r.error);
  if (!r.in.empty())
    return make_error("hand-off message of {} bytes: {} bytes left over after its last field", bytes.size(), r.in.size());
  if (std::string bad = check_values(m); !bad.empty()) return make_error("hand-off message of {} bytes: {}", bytes.size(), bad);
  return m;
}

}  // namespace tandem
