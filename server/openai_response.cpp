#include "server/openai_response.h"

#include <fmt/format.h>

#include <ctime>

namespace tandem::server {

ojson OpenAiResponse::envelope(const char* object, ojson choices, const TokenUsage* usage) const {
  ojson j = {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}, {"choices", std::move(choices)}};
  if (usage)
    j["usage"] = {{"prompt_tokens", usage->prompt},
                  {"completion_tokens", usage->completion},
                  {"total_tokens", usage->prompt + usage->completion},
                  {"prompt_tokens_details", {{"cached_tokens", usage->cached}}}};
  return j;
}

ojson OpenAiResponse::chunk(const std::string& text, const ojson& logprob, const ojson& finish, bool first) const {
  ojson choice = {{"index", 0}};
  if (chat_) {
    ojson delta = ojson::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprob;
  choice["finish_reason"] = finish;
  return envelope(chunk_object(), ojson::array({choice}), nullptr);
}

ojson OpenAiResponse::delta_chunk(ojson delta, const ojson& finish) const {
  ojson choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish}};
  return envelope("chat.completion.chunk", ojson::array({choice}), nullptr);
}

ojson OpenAiResponse::usage_chunk(const TokenUsage& usage) const { return envelope(chunk_object(), ojson::array(), &usage); }

ojson OpenAiResponse::answer(const std::string& text, const ojson& tool_calls, const ojson& logprobs, const std::string& finish,
                             const TokenUsage& usage) const {
  ojson choice = {{"index", 0}};
  if (chat_) {
    choice["message"] = {{"role", "assistant"}, {"content", text.empty() && !tool_calls.empty() ? ojson(nullptr) : ojson(text)}};
    if (!tool_calls.empty()) choice["message"]["tool_calls"] = tool_calls;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish;
  return envelope(chat_ ? "chat.completion" : "text_completion", ojson::array({choice}), &usage);
}

ojson tool_call_json(ToolCall call, std::string id) {
  return {{"id", std::move(id)},
          {"type", "function"},
          {"function", {{"name", std::move(call.name)}, {"arguments", std::move(call.arguments)}}}};
}

std::vector<ojson> tool_call_deltas(const std::vector<ojson>& calls, size_t first_index) {
  std::vector<ojson> out;
  for (size_t k = 0; k < calls.size(); k++) {
    const ojson& c = calls[k];
    const size_t i = first_index + k;
    out.push_back({{"tool_calls", ojson::array({{{"index", i}, {"id", c["id"]}, {"type", "function"},
                                                 {"function", {{"name", c["function"]["name"]}, {"arguments", ""}}}}})}});
    out.push_back({{"tool_calls", ojson::array({{{"index", i}, {"function", {{"arguments", c["function"]["arguments"]}}}}})}});
  }
  return out;
}

}  // namespace tandem::server

namespace tandem::server {

std::string sse_event(const ojson& data, const std::string& event_name) {
  std::string out = event_name.empty() ? std::string() : "event: " + event_name + "\n";
  return out + "data: " + dump_json(data) + "\n\n";
}

void ChatCompletionsWire::set_engine_id(int64_t id) { response_.set_id(fmt::format("{}-{}", response_.chat() ? "chatcmpl" : "cmpl", id)); }

ojson ChatCompletionsWire::error(const std::string& message, const std::string& type, const std::string& param) const {
  return error_body(message, type, param);
}

ojson ChatCompletionsWire::whole(const Answer& a) {
  const bool chat = response_.chat();
  ojson lp = nullptr;
  if (!a.logprobs.empty()) lp = chat ? chat_logprobs(a.logprobs) : completion_logprobs(a.logprobs, top_logprobs_);
  ojson body = response_.answer(a.text, a.tool_calls, lp, a.finish, a.usage);
  if (!a.reasoning.empty()) body["choices"][0]["message"]["reasoning_content"] = a.reasoning;
  return body;
}

// The role chunk (chat), an empty text chunk (completions).
std::string ChatCompletionsWire::open() { return sse_event(response_.chunk("", nullptr, nullptr, true)); }

std::string ChatCompletionsWire::text(const std::string& text, const TokenLogprob* lp) {
  ojson lj = nullptr;
  if (lp) {
    lj = response_.chat() ? chat_logprobs({*lp}) : completion_logprobs({*lp}, top_logprobs_, streamed_bytes_);
    streamed_bytes_ += lp->bytes.size();
  }
  return sse_event(response_.chunk(text, lj, nullptr, false));
}

std::string ChatCompletionsWire::reasoning(const std::string& text) {
  return sse_event(response_.delta_chunk({{"reasoning_content", text}}, nullptr));
}

std::string ChatCompletionsWire::calls(const std::vector<ojson>& added, size_t first_index) {
  std::string out;
  for (ojson& delta : tool_call_deltas(added, first_index)) out += sse_event(response_.delta_chunk(std::move(delta), nullptr));
  return out;
}

std::string ChatCompletionsWire::close(const Answer& a) {
  std::string out = sse_event(response_.chunk("", nullptr, a.finish, false));
  if (include_usage_) out += sse_event(response_.usage_chunk(a.usage));
  return out + "data: [DONE]\n\n";
}

// The error event, then [DONE], so that a client reading to [DONE] sees why.
std::string ChatCompletionsWire::stream_error(const ojson& error_body) { return sse_event(error_body) + "data: [DONE]\n\n"; }

}  // namespace tandem::server
