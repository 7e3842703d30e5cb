// OpenAI's answer JSON for one completion request, apart from how it is sent: the envelope
// (id, object, created, model, usage), a stream's chunks (text, tool-call deltas, the finish)
// and a whole answer's choice. Chat and completions differ only here.
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include "chat/tool_calls.h"
#include "server/answer_wire.h"
#include "server/openai_json.h"

namespace tandem::server {

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

// /v1/chat/completions and /v1/completions on the wire: chunks with "data: [DONE]" at the end,
// logprobs in each endpoint's shape, usage last when the stream asked for it.
class ChatCompletionsWire : public AnswerWire {
 public:
  ChatCompletionsWire(bool chat, std::string model, bool include_usage, bool top_logprobs)
      : response_(chat, std::move(model)), include_usage_(include_usage), top_logprobs_(top_logprobs) {}
  void set_engine_id(int64_t id) override;
  ojson error(const std::string& message, const std::string& type, const std::string& param) const override;
  ojson whole(const Answer& a) override;
  std::string open() override;
  std::string text(const std::string& text, const TokenLogprob* lp) override;
  std::string reasoning(const std::string& text) override;
  std::string calls(const std::vector<ojson>& added, size_t first_index) override;
  std::string close(const Answer& a) override;
  std::string stream_error(const ojson& error_body) override;

 private:
  OpenAiResponse response_;
  bool include_usage_, top_logprobs_;
  size_t streamed_bytes_ = 0;  // completions' text_offset
};

// One call as OpenAI returns it: {"id", "type": "function", "function": {"name", "arguments"}}.
ojson tool_call_json(ToolCall call, std::string id);
// Each call as OpenAI streams it: its index, id, type and name with empty arguments, then
// the arguments. `calls` are OpenAI's JSON (tool_call_json), indexed from `first_index`.
std::vector<ojson> tool_call_deltas(const std::vector<ojson>& calls, size_t first_index);

}  // namespace tandem::server
