// OpenAI's answer JSON for one completion request, apart from how it is sent: the envelope
// (id, object, created, model, usage), a stream's chunks (text, tool-call deltas, the finish)
// and a whole answer's choice. Chat and completions differ only here.
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include "chat/tool_calls.h"
#include "server/openai_json.h"

namespace tandem::server {

struct TokenUsage {
  int prompt = 0, completion = 0;
  int cached = 0;  // prompt tokens the prefix cache gave, within the request's cache scope only
};

class OpenAiResponse {
 public:
  OpenAiResponse(bool chat, std::string model) : chat_(chat), model_(std::move(model)) {}
  void set_id(std::string id) { id_ = std::move(id); }
  bool chat() const { return chat_; }

  // {"id", "object", "created", "model", "choices"[, "usage"]}.
  ojson envelope(const char* object, ojson choices, const TokenUsage* usage) const;
  // A stream chunk of text (chat: a delta; the first one names the role).
  ojson chunk(const std::string& text, const ojson& logprob, const ojson& finish, bool first) const;
  // A chat stream chunk with this delta (tool calls).
  ojson delta_chunk(ojson delta, const ojson& finish) const;
  // The last chunk of a stream that asked for usage: no choices, the counts.
  ojson usage_chunk(const TokenUsage& usage) const;
  // The whole answer: its one choice, in an envelope with usage. With calls and no text, a chat
  // message's content is null, as OpenAI answers.
  ojson answer(const std::string& text, const ojson& tool_calls, const ojson& logprobs, const std::string& finish,
               const TokenUsage& usage) const;

 private:
  const char* chunk_object() const { return chat_ ? "chat.completion.chunk" : "text_completion"; }
  bool chat_;
  std::string model_, id_;
  int64_t created_ = (int64_t)std::time(nullptr);
};

// One call as OpenAI returns it: {"id", "type": "function", "function": {"name", "arguments"}}.
ojson tool_call_json(ToolCall call, std::string id);
// Each call as OpenAI streams it: its index, id, type and name with empty arguments, then
// the arguments. `calls` are OpenAI's JSON (tool_call_json), indexed from `first_index`.
std::vector<ojson> tool_call_deltas(const std::vector<ojson>& calls, size_t first_index);

}  // namespace tandem::server
