#include "server/openai_response.h"

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
