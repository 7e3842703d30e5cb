// Anthropic's Messages API: POST /v1/messages (the request: anthropic_request.h; the answer from
// the same completion run as chat completions, written here as a message or its stream).
//
// A stream is: message_start, ping; per content block (thinking, text, tool_use, in the order
// the model wrote them) content_block_start, content_block_delta (thinking_delta, text_delta,
// input_json_delta) and content_block_stop; then message_delta (stop_reason, stop_sequence,
// usage) and message_stop. Errors, streamed or not, are {"type": "error", "error": {"type",
// "message"}} with Anthropic's error types.
#pragma once

#include <memory>
#include <string>

#include "server/answer_wire.h"
#include "server/completion_run.h"

namespace tandem::server {

class AnthropicWire : public AnswerWire {
 public:
  AnthropicWire(std::string model, int n_prompt) : model_(std::move(model)), n_prompt_(n_prompt) {}
  void set_engine_id(int64_t engine_id) override;
  ojson error(const std::string& message, const std::string& type, const std::string& param) const override;
  ojson whole(const Answer& a) override;
  std::string open() override;
  std::string text(const std::string& text, const TokenLogprob* lp) override;
  std::string reasoning(const std::string& text) override;
  std::string calls(const std::vector<ojson>& added, size_t first_index) override;
  std::string close(const Answer& a) override;
  std::string stream_error(const ojson& error_body) override;

 private:
  enum class Block { None, Text, Thinking };
  std::string open_block(Block kind);
  std::string close_block();

  std::string model_, id_;
  int n_prompt_;
  Block open_ = Block::None;
  int next_index_ = 0;  // the next content block's index
};

// Anthropic's error body: {"type": "error", "error": {"type", "message"}}, its type mapped from
// tandem's OpenAI-style one (server_error -> api_error, service_unavailable -> overloaded_error).
ojson anthropic_error(const std::string& message, const std::string& openai_type);

// On a worker thread, for POST /v1/messages.
void run_messages(EndpointContext& ctx, const HttpRequest& req, std::shared_ptr<ResponseWriter> w, HttpHeaders extra);

}  // namespace tandem::server
