// Chat formatting from the GGUF key tokenizer.chat_template. This first version recognises
// the ChatML family (SmolLM2, Qwen) by its markers and renders it natively, including a default
// system message the template inserts; other templates are a clear error naming them.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf_file.h"

namespace tandem {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> from_gguf(const GgufFile& f);
  static Result<ChatTemplate> from_source(const std::string& source);

  // The prompt text for the conversation; add_generation_prompt opens the assistant's turn.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  const std::string& family() const { return family_; }
  const std::string& default_system() const { return default_system_; }

 private:
  std::string family_;
  std::string default_system_;  // inserted when the first message is not a system message
};

}  // namespace tandem
