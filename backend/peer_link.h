// Point-to-point messages between the ranks of a disaggregated job (engine/disaggregation.h):
// the router's requests to prefill ranks, their replies, and the KV blocks they stream to the
// decode rank. Two kinds of traffic, each delivered in the order a rank sent it:
//   - control messages: small byte strings the link copies and keeps until they are delivered;
//   - payloads: bytes sent from, and received into, memory the caller keeps untouched until the
//     handle is done (a KV block straight out of one pool and into another, no staging copy).
// A receiver posts its payload receives from a rank in the order that rank sent them (the
// control message that announced them says which), so no payload carries a header.
// Nothing blocks: a dead peer leaves handles that never complete, which the caller times out
// (the ranks send each other heartbeats). Every call is safe from any thread (one lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct PeerMessage {
  int from = -1;
  std::vector<uint8_t> bytes;
};

// Counters of what the link moved (payloads only: the KV).
struct PeerLinkStats {
  uint64_t payloads_sent = 0, payload_bytes_sent = 0;
  uint64_t payloads_received = 0, payload_bytes_received = 0;
};

class PeerLink {
 public:
  using Handle = int64_t;  // a payload in flight; 0 is none
  virtual ~PeerLink() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;

  // A control message to rank `to` (the link keeps the bytes until they are delivered).
  virtual void send(int to, std::vector<uint8_t> bytes) = 0;
  // The next control message from rank `from`, if one has arrived.
  virtual std::optional<PeerMessage> receive(int from) = 0;

  // `bytes` of `data` to rank `to`: data stays unchanged until done() says so.
  virtual Handle send_payload(int to, const void* data, size_t bytes) = 0;
  // The next payload from rank `from` into `data` (bytes: its exact size).
  virtual Handle receive_payload(int from, void* data, size_t bytes) = 0;
  // True once the payload has left (a send) or landed (a receive); the handle is then spent.
  virtual bool done(Handle h) = 0;
  // Gives up a receive whose sender died: true when no byte will land in its memory any more
  // (the memory may be reused); false when that cannot be promised (keep the memory).
  virtual bool cancel_receive(Handle h) = 0;
  // Moves outstanding control messages along (also done by every other call).
  virtual void progress() = 0;

  virtual PeerLinkStats stats() const = 0;
};

}  // namespace tandem
