// libFuzzer entry point for the Jinja subset: any template text must parse or fail with an
// error, and render within the interpreter's limits, never crash or hang.
//   build-fuzz/tests/fuzz_chat_template -max_total_time=60 -dict=tests/fuzz/jinja.dict
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto t = tandem::ChatTemplate::from_source(source, "<s>", "</s>");
  if (!t.ok()) return 0;
  (void)t->render({{"system", "sys"}, {"user", "hi"}, {"assistant", "hello"}, {"user", "bye"}}, true);
  return 0;
}
