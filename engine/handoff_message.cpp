#include "engine/handoff_message.h"

#include <cstring>
#include <type_traits>

namespace tandem {

namespace {

struct Writer {
  std::vector<uint8_t> out;
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  }
  template <class T>
  void array(const std::vector<T>& v) {
    pod((uint64_t)v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(T));
  }
  void text(const std::string& s) {
    pod((uint64_t)s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
};

// Every read is checked against the bytes left; a short or oversized field fails the message.
struct Reader {
  std::span<const uint8_t> in;
  bool ok = true;
  template <class T>
  void pod(T& v) {
    if (!ok || in.size() < sizeof v) return void(ok = false);
    std::memcpy(&v, in.data(), sizeof v);
    in = in.subspan(sizeof v);
  }
  template <class T>
  void array(std::vector<T>& v) {
    uint64_t n = 0;
    pod(n);
    if (!ok || n > in.size() / sizeof(T)) return void(ok = false);
    v.resize((size_t)n);
    std::memcpy(v.data(), in.data(), (size_t)n * sizeof(T));
    in = in.subspan((size_t)n * sizeof(T));
  }
  void text(std::string& s) {
    std::vector<char> v;
    array(v);
    s.assign(v.begin(), v.end());
  }
};

// One field list for both directions: what encode writes, decode reads, in the same order.
template <class Io, class Msg>
void fields(Io& io, Msg& m) {
  io.pod(m.id), io.pod(m.first_block), io.pod(m.n_blocks);
  io.array(m.tokens);
  io.text(m.cache_scope), io.text(m.tenant), io.text(m.error);
  io.pod(m.n_cached), io.pod(m.queue_s), io.pod(m.prefill_s);
  io.array(m.logits);
  io.pod(m.block_bytes), io.pod(m.used_blocks), io.pod(m.total_blocks), io.pod(m.queued_tokens);
  io.pod(m.blocks_sent), io.pod(m.bytes_sent), io.pod(m.busy_s);
}

}  // namespace

std::vector<uint8_t> HandoffMessage::encode() const {
  Writer w;
  w.pod(kind);
  fields(w, *this);
  return std::move(w.out);
}

std::optional<HandoffMessage> HandoffMessage::decode(std::span<const uint8_t> bytes) {
  HandoffMessage m;
  Reader r{bytes};
  r.pod(m.kind);
  fields(r, m);
  if (!r.ok || !r.in.empty() || m.kind < Kind::Prefill || m.kind > Kind::Stopped) return std::nullopt;
  return m;
}

}  // namespace tandem
