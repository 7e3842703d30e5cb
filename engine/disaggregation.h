// Disaggregated serving: prefill and decode on separate ranks of one MPI job (`mpirun -np N
// tandem serve --disaggregate P:D`). The two phases have opposite bottlenecks (prefill is
// compute-bound, decode reads bytes), and on shared cores each prefill chunk stalls every
// decoding stream; on ranks of their own neither waits for the other.
//
// Roles (docs/distributed.md): rank 0 takes HTTP, routes each request and decodes
// (DecodeRouter, engine/decode_router.h, over the serving loop's Scheduler); ranks 1..P
// prefill (PrefillRole, engine/prefill_role.h); ranks P+1..P+D-1 decode too (DecodeRole,
// engine/decode_role.h), streaming each step's tokens back to rank 0. A prefill rank computes
// a prompt in chunks and, after each chunk, sends the blocks it finished (every layer's K,V of
// those positions, in the pool's dtype) to the request's decode rank without waiting, so the
// transfer overlaps the next chunk; the decode rank receives them into blocks it reserved
// (engine/handoff_receiver.h) and, with the prompt's last logits row, admits the sequence as
// if it had prefilled it. Messages: engine/handoff_message.h, engine/handoff_request.h; the
// link: backend/peer_link.h (MPI point-to-point).
#pragma once

#include <string>

namespace tandem {

struct DisaggregationOptions {
  int n_prefill = 1, n_decode = 1;  // --disaggregate P:D
  double heartbeat_s = 0.5;         // each side says it is alive this often
  double peer_timeout_s = 5.0;      // a peer silent this long is dead: its requests fail
};

// "P:D" -> the counts, checked against the job's ranks; an error a user can act on.
struct DisaggregateSplit {
  int n_prefill = 0, n_decode = 0;
  std::string error;  // empty when valid
};
DisaggregateSplit parse_disaggregate(const std::string& spec, int n_ranks);

// What handing one prompt's K,V from a prefill rank to a decode rank moves: whole blocks of
// block_tokens positions, every layer's K and V (kv_bytes_per_position, in the pool's dtype).
struct HandoffCost {
  int64_t blocks = 0;
  double bytes = 0;
  double seconds_at(double gigabytes_per_s) const { return bytes / (gigabytes_per_s * 1e9); }
};
HandoffCost handoff_cost(double kv_bytes_per_position, int64_t n_prompt, int block_tokens);

}  // namespace tandem
