// Chat formatting: the model's own Jinja template from the GGUF key tokenizer.chat_template,
// rendered by tandem's Jinja subset (chat/jinja/) with the variables Hugging Face's
// apply_chat_template provides (messages, add_generation_prompt, bos_token, eos_token, tools).
//
// A GGUF's template is untrusted code and a request's messages are untrusted data:
// - every render runs within TemplateLimits (steps, bytes, nesting, wall time; see
//   chat/jinja/limits.h), so a hostile template ends with an error, never a hang or OOM;
// - the rendered prompt says which of its bytes came from the request (RenderedPrompt::
//   data_spans), and Tokenizer::encode_chat parses special tokens only outside them, so a user
//   typing "<|im_end|>\n<|im_start|>system" gets text, not a forged system turn.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "chat/jinja/limits.h"
#include "tokenizer/rendered_prompt.h"
#include "tokenizer/vocab.h"

namespace tandem {

namespace jinja {
struct Node;
}

using TemplateLimits = jinja::Limits;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
};

class ChatTemplate {
 public:
  // The special tokens' text comes from the vocabulary. `limits` bound parsing (max_nesting)
  // and every later render. A file without tokenizer.chat_template gets tandem's built-in
  // template for its family when its vocabulary identifies one (chat/builtin_templates.h:
  // Gemma), else an error.
  static Result<ChatTemplate> from_gguf(const GgufFile& f, const Vocab& vocab, const TemplateLimits& limits = {});
  // A syntax error, an unsupported construct or nesting past limits.max_nesting is an error
  // naming the template and the line.
  static Result<ChatTemplate> from_source(const std::string& source, std::string bos_token, std::string eos_token,
                                          const TemplateLimits& limits = {});

  // The prompt for the conversation; add_generation_prompt opens the assistant's turn. Every
  // message's role and content is request data (see RenderedPrompt).
  Result<RenderedPrompt> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // The same from OpenAI-style JSON messages (content may be a list of parts; tool calls),
  // with optional extra variables (e.g. {"tools": [...]}) for the template. Every string in
  // `messages` and `extra` is request data. JSON nested deeper than limits().max_nesting is an
  // error ("message JSON nested deeper than N"), as is any limit the render reaches.
  Result<RenderedPrompt> render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                     const nlohmann::ordered_json* extra = nullptr) const;

  const std::string& source() const { return source_; }
  // Where the template came from: "tokenizer.chat_template", "built-in gemma (...)", or
  // "source" (from_source).
  const std::string& origin() const { return origin_; }
  const std::string& bos_token() const { return bos_; }
  const TemplateLimits& limits() const { return limits_; }
  void set_limits(const TemplateLimits& limits) { limits_ = limits; }

 private:
  std::string source_, bos_, eos_;
  std::string origin_ = "source";
  TemplateLimits limits_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> body_;
};

// A template's first line, shortened, to name it in messages.
std::string template_head(const std::string& source);

}  // namespace tandem
