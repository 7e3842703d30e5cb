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
}

// Values no sender writes: a negative count or index, a time that is not a number.
std::string check_values(const HandoffMessage& m) {
  using K = HandoffMessage::Kind;
  const std::pair<const char*, int64_t> counts[] = {
      {"id", m.id},                     {"first_block", m.first_block}, {"n_blocks", m.n_blocks},
      {"n_cached", m.n_cached},         {"block_bytes", m.block_bytes}, {"used_blocks", m.used_blocks},
      {"total_blocks", m.total_blocks}, {"queued_tokens", m.queued_tokens}, {"blocks_sent", m.blocks_sent},
      {"bytes_sent", m.bytes_sent}};
  for (const auto& [name, v] : counts)
    if (v < 0) return fmt::format("field '{}' is negative ({})", name, v);
  const std::pair<const char*, double> times[] = {{"queue_s", m.queue_s}, {"prefill_s", m.prefill_s}, {"busy_s", m.busy_s}};
  for (const auto& [name, v] : times)
    if (!std::isfinite(v) || v < 0) return fmt::format("field '{}' is not a time in seconds ({})", name, v);
  if (m.kind == K::Prefill && m.tokens.empty()) return "a Prefill message without a prompt";
  if (m.kind == K::Blocks && m.n_blocks == 0) return "a Blocks message announcing no block";
  if (m.kind == K::Done && m.logits.empty()) return "a Done message without the prompt's last logits row";
  if (m.kind == K::Hello && m.block_bytes == 0) return "a Hello message with blocks of 0 bytes";
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
  HandoffReader r{bytes};
  uint32_t magic = 0;
  r.pod("magic", magic);
  if (r.ok() && magic != kMagic)
    return make_error("hand-off message of {} bytes: not one (it starts with {:#010x}, not {:#010x})", bytes.size(), magic, kMagic);
  r.pod("kind", m.kind);
  if (r.ok() && (m.kind < Kind::Prefill || m.kind > Kind::Stopped))
    return make_error("hand-off message of {} bytes: unknown kind {}", bytes.size(), (int)m.kind);
  fields(r, m);
  if (!r.ok()) return make_error("hand-off message of {} bytes: {}", bytes.size(), r.error);
  if (!r.in.empty())
    return make_error("hand-off message of {} bytes: {} bytes left over after its last field", bytes.size(), r.in.size());
  if (std::string bad = check_values(m); !bad.empty()) return make_error("hand-off message of {} bytes: {}", bytes.size(), bad);
  return m;
}

}  // namespace tandem
