// The control messages of disaggregated serving (engine/disaggregation.h), as bytes for a
// PeerLink (backend/peer_link.h). One record for every kind, every field always written in
// one order after a magic number and the kind, so a reader needs no per-kind layout
// (engine/handoff_codec.h). A message that does not parse is refused with an error naming what
// is wrong: a buffer cut short or longer than its fields, an unknown kind, a count that does
// not fit, a negative block index.
//
//   router -> prefill rank: Prefill (a prompt to compute; its K,V from block first_block on
//            go to decode rank `peer`), Cancel, Heartbeat, Stop
//   prefill rank -> decode rank (0 or another): Blocks (n_blocks payloads of block_bytes follow
//            on the payload stream: the request's blocks first_block, first_block + 1, ...),
//            Done (the prompt's last logits row; no more blocks), Ended (no Done will come:
//            cancelled, or `error`)
//   prefill rank -> router: Hello (its pool's block shape, once), Heartbeat (its load),
//            Computed (the prompt went to another decode rank: its timing), Ended, Stopped
//   router -> decode rank > 0: Decode (a request to decode: `request`, its prompt computed by
//            prefill rank `peer`), Cancel, Ended (its prompt will reach no prefill rank: free
//            its blocks), PeerDown (prefill rank `peer` died: `error`), Heartbeat, Stop
//   decode rank > 0 -> router: Hello, Reserved (the request's blocks are held; the prefill
//            rank sends from first_block on), Events (a request's tokens since the last step,
//            and its finish), Heartbeat (its load), Stopped
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem {

struct HandoffMessage {
  enum class Kind : uint8_t {
    Prefill = 1, Cancel, Heartbeat, Stop, Hello, Blocks, Done, Ended, Stopped,
    Decode, Reserved, Events, PeerDown, Computed
  };
  static constexpr Kind kLastKind = Kind::Computed;
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
  int64_t blocks_sent = 0, bytes_sent = 0;  // Heartbeat: KV payloads sent (prefill) or received (decode) so far
  double busy_s = 0;                        // Heartbeat: seconds in forward passes so far
  int64_t running = 0, handoffs = 0;        // Heartbeat of a decode rank: its requests, hand-offs admitted so far
  int64_t peer = 0;                         // Prefill: the decode rank; Decode: the prefill rank; PeerDown: the dead rank
  std::vector<uint8_t> request;             // Decode: the request (engine/handoff_request.h)
  // Events: the request's tokens (each with its logprob and ev_top_n alternatives, their ids
  // and logprobs one after another), then, with finish != 0 (a FinishReason), its end: error,
  // n_prompt, n_cached, n_generated, n_preemptions, finish_flags (1: by a stop token, 2: over
  // the grammar's budget). Its first also carries its hand-off's queue_s, prefill_s,
  // transfer_s, stream_s and n_blocks, with handoffs = 1.
  std::vector<int32_t> ev_tokens, ev_top_n, ev_top_ids;
  std::vector<float> ev_logprobs, ev_top_logprobs;
  uint8_t finish = 0, finish_flags = 0;
  int64_t n_prompt = 0, n_generated = 0, n_preemptions = 0;
  double transfer_s = 0, stream_s = 0;

  static constexpr uint32_t kMagic = 0x484b5654;  // "TVKH" in memory: a tandem hand-off message
  std::vector<uint8_t> encode() const;
  // The message in `bytes`, or why they are not one.
  static Result<HandoffMessage> decode(std::span<const uint8_t> bytes);
  // What a prefill or decode rank sends the router first: its KV blocks' size and count.
  static HandoffMessage hello(int64_t block_bytes, int64_t total_blocks) {
    HandoffMessage m;
    m.kind = Kind::Hello, m.block_bytes = block_bytes, m.total_blocks = total_blocks;
    return m;
  }
};

}  // namespace tandem
