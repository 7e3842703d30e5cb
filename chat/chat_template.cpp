#include "chat/chat_template.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/builtin_templates.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/parser.h"

namespace tandem {

std::string template_head(const std::string& source) {
  std::string head = source.substr(0, 60);
  for (char& c : head)
    if (c == '\n' || c == '\r') c = ' ';
  return "\"" + head + (source.size() > 60 ? "...\"" : "\"");
}

Result<ChatTemplate> ChatTemplate::from_gguf(const GgufFile& f, const Vocab& vocab, const TemplateLimits& limits) {
  auto src = f.get_string("tokenizer.chat_template");
  if (!src.ok()) return src.error();
  auto text = [&](int32_t id) { return id >= 0 && id < vocab.size() ? vocab.tokens[id] : std::string(); };
  if (src->has_value()) {
    auto t = from_source(std::string(**src), text(vocab.bos), text(vocab.eos), limits);
    if (t.ok()) t->origin_ = "tokenizer.chat_template";
    return t;
  }
  // No template in the file: the family's own format when its vocabulary says which it is.
  const auto builtin = builtin_template_for(vocab);
  if (!builtin)
    return make_error("this model has no tokenizer.chat_template and tandem has no built-in one for its vocabulary; "
                      "use `tandem run` with a raw prompt, or a template file (`tandem serve --chat-template-file`)");
  auto t = from_source(std::string(builtin->source), text(vocab.bos), text(vocab.eos), limits);
  if (t.ok()) t->origin_ = fmt::format("built-in {} (the file has no tokenizer.chat_template)", builtin->name);
  return t;
}

Result<ChatTemplate> ChatTemplate::from_source(const std::string& source, std::string bos_token, std::string eos_token,
                                               const TemplateLimits& limits) {
  ChatTemplate t;
  t.source_ = source;
  t.limits_ = limits;
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  try {
    t.body_ = std::make_shared<const jinja::Body>(jinja::parse_template(source, limits.max_nesting));
  } catch (const jinja::Error& e) {
    return make_error("chat template {} is not supported: {}", template_head(source), e.what());
  } catch (const std::exception& e) {  // a bug of ours, still only this request's failure
    return make_error("chat template {} could not be parsed: {}", template_head(source), e.what());
  }
  return t;
}

Result<RenderedPrompt> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return render_json(j, add_generation_prompt);
}

Result<RenderedPrompt> ChatTemplate::render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                                 const nlohmann::ordered_json* extra) const {
  jinja::Object ctx;
  try {  // the request's JSON, as tainted values
    ctx.emplace_back("messages", jinja::Value::from_json(messages, limits_.max_nesting));
    if (extra && extra->is_object())
      for (auto it = extra->begin(); it != extra->end(); ++it)
        ctx.emplace_back(it.key(), jinja::Value::from_json(it.value(), limits_.max_nesting));
  } catch (const jinja::Error& e) {
    return make_error("the request's messages cannot be used: {}", e.what());
  }
  ctx.emplace_back("add_generation_prompt", jinja::Value(add_generation_prompt));
  ctx.emplace_back("bos_token", jinja::Value(bos_));
  ctx.emplace_back("eos_token", jinja::Value(eos_));
  try {
    return jinja::render(*body_, ctx, limits_);
  } catch (const std::exception& e) {  // jinja::Error (a limit, raise_exception), or a failure inside a builtin
    return make_error("chat template {}: {}", template_head(source_), e.what());
  }
}

}  // namespace tandem
