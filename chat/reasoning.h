// A chat answer's reasoning, apart from its content, as llama-server returns it
// ("reasoning_content" beside "content").
//
// Formats (what the model writes):
//   Harmony (gpt-oss): messages on channels, the prompt ending "<|start|>assistant":
//           <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...
//           analysis -> reasoning, final (and commentary without a recipient) -> content; a
//           message to a function is a tool call, its header naming the recipient before or
//           after the channel:
//           <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
//           <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
//   Think   (Qwen3, DeepSeek-R1, QwQ): <think>...</think> at the start of the answer; the
//           answer starts inside it when the prompt ends with "<think>" (the template opened it).
// The format is read from the chat template: "<|channel|>" is Harmony, "<think>" or
// "</think>" is Think. Harmony's markup tokens are control tokens: the server renders them
// as text for the parser (reasoning_markers).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_calls.h"

namespace tandem {

enum class ReasoningFormat { None, Harmony, Think };

const char* reasoning_format_name(ReasoningFormat f);
ReasoningFormat detect_reasoning_format(std::string_view template_source);

// Token texts the parser must see (rendered as text though they are control tokens).
std::vector<std::string> reasoning_markers(ReasoningFormat f);

struct ReasoningOutput {
  std::string content, reasoning;
  std::vector<ToolCall> calls;  // Harmony's calls to functions
};

// Incremental: push() returns what is decided so far; a partial marker is held. Pieces from
// any split of the same text join to what parse_reasoning() returns for the whole.
class ReasoningStream {
 public:
  // prompt_tail: the end of the rendered prompt (Think starts in the reasoning when it ends
  // with "<think>" and optional whitespace).
  explicit ReasoningStream(ReasoningFormat format, std::string_view prompt_tail = {});
  ReasoningOutput push(std::string_view text);
  ReasoningOutput finish();  // an unterminated message or tool call ends here

 private:
  void run(bool final, ReasoningOutput* out);
  void run_harmony(bool final, ReasoningOutput* out);
  void run_think(bool final, ReasoningOutput* out);
  void harmony_header(const std::string& header);
  void end_message(ReasoningOutput* out);

  ReasoningFormat format_;
  std::string buf_;  // undecided text
  // Harmony: inside a message's body (after <|message|>), where it goes.
  enum class Sink { Content, Reasoning, Call };
  bool in_body_ = false;
  Sink sink_ = Sink::Content;
  std::string call_name_, call_args_;
  // Think: 0 before anything but whitespace, 1 in the reasoning, 2 in the content.
  int think_state_ = 0;
  bool reasoning_started_ = false;  // leading whitespace of the reasoning is dropped
  bool trim_content_start_ = false;  // whitespace after </think> is dropped
};

ReasoningOutput parse_reasoning(ReasoningFormat format, std::string_view text, std::string_view prompt_tail = {});

}  // namespace tandem
