// What travels between the router (rank 0) and a decode rank of its own in disaggregated
// serving (engine/disaggregation.h) besides K,V: a request as the decode rank's scheduler takes
// it (prompt, sampling, stop tokens, logprobs, speculation, grammar), and the events that
// scheduler reports for it, which the router hands to the request's callback as if its own
// scheduler had made them. Both as bytes with the hand-off codec (engine/handoff_codec.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "engine/handoff_message.h"
#include "engine/scheduler.h"

namespace tandem {

// Every field of `p` a decode rank needs (prefill_only is never sent: false there).
std::vector<uint8_t> encode_request(const RequestParams& p);
// The request in `bytes` (its grammar checked as any grammar is), or why they are not one.
Result<RequestParams> decode_request(std::span<const uint8_t> bytes);

// Appends one event of a request to its Events message: a token (with its logprobs), or the
// finish (its reason, error and counts).
void append_event(HandoffMessage& m, const SeqEvent& e);
// The events an Events message holds, in order; the finish, if any, last.
std::vector<SeqEvent> events_of(const HandoffMessage& m);

}  // namespace tandem
