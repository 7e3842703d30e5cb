// libFuzzer entry point for the tool-call parser (chat/tool_calls.h): any model output, in any
// family, parses without a crash; every call's arguments are a JSON object; and the output
// streamed in two pieces (cut where the first byte says) gives the one-shot answer.
//   build-fuzz/tests/fuzz_tool_calls -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto family = static_cast<tandem::ToolCallFamily>(data[0] % 4);  // Hermes, Llama3, Mistral, Generic
  const size_t max_calls = (data[0] & 0x80) ? 1 : SIZE_MAX;
  const auto whole = tandem::parse_tool_calls(family, text, max_calls);
  for (const auto& c : whole.calls) {
    const auto j = nlohmann::json::parse(c.arguments, nullptr, false);
    if (j.is_discarded() || !j.is_object() || c.name.empty()) std::abort();
  }
  const size_t cut = text.empty() ? 0 : (data[0] * 131u) % (text.size() + 1);
  tandem::ToolCallStream s(family, max_calls);
  auto a = s.push(std::string_view(text).substr(0, cut));
  auto b = s.push(std::string_view(text).substr(cut));
  auto c = s.finish();
  const std::string content = a.content + b.content + c.content;
  if (content != whole.content || a.calls.size() + b.calls.size() + c.calls.size() != whole.calls.size()) std::abort();
  return 0;
}
