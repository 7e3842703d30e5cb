// libFuzzer entry point for the server's request handling before the engine: any body must
// parse (depth-bounded, as the server parses it) to a request or to an error naming the field,
// never crash; the same body sent to /tokenize, /detokenize and /apply-template (on the tiny
// model's vocabulary) must give valid JSON or an error; the same body as a Responses or an
// Anthropic Messages request must translate or fail naming a path; and token bytes of any kind
// must become valid UTF-8 text.
//   build-fuzz/tests/fuzz_openai_request -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/openai_json.h"
#include "server/anthropic_request.h"
#include "server/openai_request.h"
#include "server/responses_request.h"
#include "server/text_stream.h"
#include "server/token_endpoints.h"
#include "../tiny_model.h"

namespace {
const tandem::Tokenizer& tiny_tokenizer() {
  static const auto file = tandem::test::tiny_model_file(tandem::test::TinyShape{});
  static const auto tok = tandem::Tokenizer::from_gguf(*file);
  if (!tok.ok()) std::abort();
  return *tok.value();
}
const tandem::ChatTemplate& tiny_template() {
  static const auto t = tandem::ChatTemplate::from_source(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}", "", "");
  if (!t.ok()) std::abort();
  return t.value();
}
// An answer is JSON that parses.
void must_be_json(const tandem::Result<std::string>& r) {
  if (r.ok() && !nlohmann::json::accept(r.value())) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto j = tandem::server::parse_json_body(body);
  if (j.ok()) {
    std::string bad;
    (void)tandem::server::parse_request(j.value(), (data[0] & 1) != 0, 42, &bad);
    static tandem::server::ResponsesStore store(1 << 16);
    (void)tandem::server::parse_responses_request(j.value(), store, "", 42, &bad);
    (void)tandem::server::parse_anthropic_request(j.value(), 42, &bad);
    must_be_json(tandem::server::tokenize_answer(j.value(), tiny_tokenizer(), &bad));
    must_be_json(tandem::server::detokenize_answer(j.value(), tiny_tokenizer(), &bad));
    must_be_json(tandem::server::apply_template_answer(j.value(), &tiny_template(), &bad));
  }
  // The same bytes as model output: streamed text and logprob tokens are always valid UTF-8.
  tandem::server::TextStream ts({"\n\n"});
  std::string out;
  for (size_t i = 0; i < body.size(); i += 3) out += ts.push(body.substr(i, 3));
  out += ts.flush();
  if (!tandem::server::is_valid_utf8(out) || !tandem::server::is_valid_utf8(tandem::server::token_display(body))) std::abort();
  (void)tandem::server::dump_json(tandem::server::chat_logprobs({{body, -1.0f, {{body, -2.0f}}}}));
  return 0;
}
