#include "tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser.h"

namespace tandem {

std::string template_head(const std::string& source) {
  std::string head = source.substr(0, 60);
  for (char& c : head)
    if (c == '\n' || c == '\r') c = ' ';
  return "\"" + head + (source.size() > 60 ? "...\"" : "\"");
}

Result<ChatTemplate> ChatTemplate::from_gguf(const GgufFile& f, const Vocab& vocab) {
  auto src = f.get_string("tokenizer.chat_template");
  if (!src.ok()) return src.error();
  if (!src->has_value()) return make_error("this model has no tokenizer.chat_template; use `tandem run` with a raw prompt");
  auto text = [&](int32_t id) { return id >= 0 && id < vocab.size() ? vocab.tokens[id] : std::string(); };
  return from_source(std::string(**src), text(vocab.bos), text(vocab.eos));
}

Result<ChatTemplate> ChatTemplate::from_source(const std::string& source, std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  t.source_ = source;
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  try {
    t.body_ = std::make_shared<const jinja::Body>(jinja::parse_template(source));
  } catch (const jinja::Error& e) {
    return make_error("chat template {} is not supported: {}", template_head(source), e.what());
  } catch (const std::exception& e) {  // a bug of ours, still only this request's failure
    return make_error("chat template {} could not be parsed: {}", template_head(source), e.what());
  }
  return t;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return render_json(j, add_generation_prompt);
}

Result<std::string> ChatTemplate::render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                              const nlohmann::ordered_json* extra) const {
  jinja::Object ctx = {{"messages", jinja::Value::from_json(messages)},
                       {"add_generation_prompt", jinja::Value(add_generation_prompt)},
                       {"bos_token", jinja::Value(bos_)},
                       {"eos_token", jinja::Value(eos_)}};
  if (extra && extra->is_object())
    for (auto it = extra->begin(); it != extra->end(); ++it) ctx.emplace_back(it.key(), jinja::Value::from_json(it.value()));
  try {
    return jinja::render(*body_, ctx);
  } catch (const std::exception& e) {  // jinja::Error, or a failure inside a builtin
    return make_error("chat template {}: {}", template_head(source_), e.what());
  }
}

}  // namespace tandem
