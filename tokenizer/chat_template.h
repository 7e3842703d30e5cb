// Chat formatting: the model's own Jinja template from the GGUF key tokenizer.chat_template,
// rendered by tandem's Jinja subset (tokenizer/jinja/) with the variables Hugging Face's
// apply_chat_template provides (messages, add_generation_prompt, bos_token, eos_token, tools).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "tokenizer/vocab.h"

namespace tandem {

namespace jinja {
struct Node;
}

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
};

class ChatTemplate {
 public:
  // The special tokens' text comes from the vocabulary.
  static Result<ChatTemplate> from_gguf(const GgufFile& f, const Vocab& vocab);
  // A syntax error or an unsupported construct is an error naming the template and the line.
  static Result<ChatTemplate> from_source(const std::string& source, std::string bos_token, std::string eos_token);

  // The prompt text for the conversation; add_generation_prompt opens the assistant's turn.
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // The same from OpenAI-style JSON messages (content may be a list of parts; tool calls),
  // with optional extra variables (e.g. {"tools": [...]}) for the template.
  Result<std::string> render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                  const nlohmann::ordered_json* extra = nullptr) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }

 private:
  std::string source_, bos_, eos_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> body_;
};

// A template's first line, shortened, to name it in messages.
std::string template_head(const std::string& source);

}  // namespace tandem
