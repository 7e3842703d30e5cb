// The control messages of disaggregated serving (engine/disaggregation.h), as bytes for a
// PeerLink (backend/peer_link.h). One record for every kind, every field always written in
// one order after a magic number and the kind, so a reader needs no per-kind layout
// (engine/handoff_codec.h). A message that does not parse is refused with an error naming what
// is wrong: a buffer cut short or longer than its fields, an unknown kind, a count that does
// not fit, a negative block index.
//
//   router -> prefill rank: Prefill (a prompt to compute; its K,V from block first_block on
//            go to the router's decode rank), Cancel, Heartbeat, Stop
//   prefill rank -> router: Hello (its pool's block shape, once), Blocks (n_blocks payloads
//            of block_bytes follow on the payload stream: the request's blocks first_block,
//            first_block + 1, ...), Done (the prompt's last logits row; no more blocks),
//            Ended (no Done will come: cancelled, or `error`), Heartbeat (its load), Stopped
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem {

struct HandoffMessage {
  enum class Kind : uint8_t { Prefill = 1, Cancel, Heartbeat, Stop, Hello, Blocks, Done, Ended, Stopped };
  Kind kind = Kind::Heartbeat;
  int64_t id = 0;                           // the request (the decode rank's sequence id)
  int64_t first_block = 0, n_blocks = 0;    // Prefill: blocks the decode rank holds; Blocks: which follow
  std::vector<int32_t> tokens;              // Prefill: the prompt
  std::string cache_scope, tenant, error;   // Prefill: the request's; Ended: why ("" = cancelled)
  int64_t n_cached = 0;                     // Done: prompt tokens the prefill rank's cache gave
  double queue_s = 0, prefill_s = 0;        // Done: waiting on the prefill rank, then computing
  std::vector<float> logits;                // Done: the prompt's last row [n_vocab]
  // Heartbeat from a prefill rank: its pool and work (Hello: block_bytes and its pool's blocks).
  int64_t block_bytes = 0, used_blocks = 0, total_blocks = 0, queued_tokens = 0;
  int64_t blocks_sent = 0, bytes_sent = 0;  // Heartbeat: KV payloads sent so far
  double busy_s = 0;                        // Heartbeat: seconds in forward passes so far

  static constexpr uint32_t kMagic = 0x484b5654;  // "TVKH" in memory: a tandem hand-off message
  std::vector<uint8_t> encode() const;
  // The message in `bytes`, or why they are not one.
  static Result<HandoffMessage> decode(std::span<const uint8_t> bytes);
};

}  // namespace tandem
