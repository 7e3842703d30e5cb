#include "tokenizer/chat_template.h"

namespace tandem {

Result<ChatTemplate> ChatTemplate::from_gguf(const GgufFile& f) {
  auto src = f.get_string("tokenizer.chat_template");
  if (!src.ok()) return src.error();
  if (!src->has_value()) return make_error("this model has no tokenizer.chat_template; use `tandem run` with a raw prompt");
  return from_source(std::string(**src));
}

Result<ChatTemplate> ChatTemplate::from_source(const std::string& source) {
  ChatTemplate t;
  if (source.find("<|im_start|>") != std::string::npos) {
    t.family_ = "chatml";
    // SmolLM2's template writes a literal system turn when the conversation has none.
    const std::string open = "<|im_start|>system\n";
    const size_t at = source.find(open);
    if (at != std::string::npos && source.find("messages[0]['role'] != 'system'") != std::string::npos) {
      const size_t start = at + open.size();
      const size_t end = source.find("<|im_end|>", start);
      if (end != std::string::npos) t.default_system_ = source.substr(start, end - start);
    }
    return t;
  }
  std::string head = source.substr(0, 80);
  for (char& c : head)
    if (c == '\n') c = ' ';
  return make_error("chat template not supported yet (tandem renders ChatML): \"{}...\"", head);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string s;
  if (!default_system_.empty() && (messages.empty() || messages[0].role != "system"))
    s += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  for (const ChatMessage& m : messages) s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) s += "<|im_start|>assistant\n";
  return s;
}

}  // namespace tandem
