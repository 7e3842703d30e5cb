// How one completion run's answer goes on the wire. The run (server/completion_run.cpp) reads
// the engine's tokens into text, reasoning and tool calls the same way for every API; an
// AnswerWire turns those into one API's JSON: OpenAI chat/completions (openai_response.h),
// OpenAI Responses (responses_api.h) or Anthropic Messages (anthropic_messages.h).
//
// Streaming methods return the bytes to send (whole SSE events, possibly several, possibly
// none); the run writes them. They are called in order on one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/openai_json.h"

namespace tandem::server {

struct TokenUsage {
  int prompt = 0, completion = 0;
  int cached = 0;  // prompt tokens the prefix cache gave, within the request's cache scope only
};

// The answer as the run has it at its end (a whole answer, or a stream's close).
struct Answer {
  std::string text, reasoning;
  std::vector<ojson> tool_calls;  // OpenAI's JSON (tool_call_json), in order
  std::vector<TokenLogprob> logprobs;  // whole answers that asked for logprobs
  // "stop", "length", "tool_calls" (OpenAI's finish_reason names; each wire maps them).
  std::string finish;
  std::string stop_sequence;  // the stop string that ended it, "" when none did
  TokenUsage usage;
};

class AnswerWire {
 public:
  virtual ~AnswerWire() = default;
  // The engine accepted the request as sequence `engine_id`: the answer's id follows from it.
  virtual void set_engine_id(int64_t engine_id) = 0;
  // The error body of this API for a refused or failed request.
  virtual ojson error(const std::string& message, const std::string& type, const std::string& param) const = 0;
  // The whole (not streamed) answer's body.
  virtual ojson whole(const Answer& a) = 0;

  // A stream: its first events, once the engine accepted it.
  virtual std::string open() = 0;
  // Text (`lp`: its token's logprob when asked for, else null), reasoning, and calls completed
  // (OpenAI's JSON, indexed from `first_index`).
  virtual std::string text(const std::string& text, const TokenLogprob* lp) = 0;
  virtual std::string reasoning(const std::string& text) = 0;
  virtual std::string calls(const std::vector<ojson>& added, size_t first_index) = 0;
  // The last events: the finish, usage and the end marker.
  virtual std::string close(const Answer& a) = 0;
  // An error after the stream began: its error event and end marker.
  virtual std::string stream_error(const ojson& error_body) = 0;
};

// One SSE event: "data: JSON\n\n", or with an event name (Responses, Anthropic) "event: NAME\n" first.
std::string sse_event(const ojson& data, const std::string& event_name = "");

}  // namespace tandem::server
