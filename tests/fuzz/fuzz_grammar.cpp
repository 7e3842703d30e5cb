// libFuzzer entry point for the grammar front ends: any text must become a grammar or an error
// (never a crash, a hang or a blow-up past GrammarLimits). Text that is JSON is also read as a
// JSON Schema; a schema that converts must give GBNF that parses, and every grammar built must
// pass validate(). Every grammar built also runs: a matcher over the input's own bytes and token
// masks over a small vocabulary, within the grammar budget (engine/grammar/budget.h), so a grammar
// whose parses multiply or deepen with every byte (issue 34's probe, seeds/grammar/probe_*) stops
// at a bound instead of hanging or growing without end.
//   build-fuzz/tests/fuzz_grammar -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_mask.h"
#include "engine/grammar/token_terminal.h"

namespace {

// Token 0 ends the text; then every single byte, a few longer pieces (runs of spaces and
// letters make a deepening grammar's state grow fastest) and two control tokens (token terminals).
const tandem::grammar::TokenMasker& small_masker() {
  static const tandem::grammar::TokenMasker masker = [] {
    std::vector<std::string> tokens{""};
    for (int b = 1; b < 256; b++) tokens.push_back(std::string(1, (char)b));
    for (const char* piece : {"{\"", "\": ", "\", \"", "true", "null", "[[", "]]", "ab", "the", "                ", "aaaaaaaaaaaaaaaa"})
      tokens.push_back(piece);
    for (const char* control : {"<|channel|>", "<|end|>"}) tokens.push_back(tandem::grammar::token_terminal_bytes(control));
    return tandem::grammar::TokenMasker(std::move(tokens), {0});
  }();
  return masker;
}

void run_grammar(const std::shared_ptr<const tandem::grammar::Grammar>& g, std::string_view text) {
  auto m = tandem::grammar::Matcher::create(g);
  if (!m.ok()) return;
  const auto& masker = small_masker();
  // The input's own bytes as far as the grammar takes them, then the first allowed token again
  // and again (down a probe's deepening path), a mask at every step.
  tandem::grammar::Matcher walk = *m;
  for (size_t i = 0; i < text.size() && i < 512; i += 8)
    if (!m->accept(text.substr(i, 8))) break;
  masker.mask(*m);
  for (int step = 0; step < 32 && !walk.must_end(); step++) {
    const auto mask = masker.mask(walk);
    if (!mask->budget_error.empty()) break;
    int32_t next = -1;
    for (int32_t t = 1; t < (int32_t)masker.n_vocab() && next < 0; t++)
      if (mask->test(t)) next = t;
    if (next < 0 || !walk.accept(masker.token_bytes(next))) break;
  }
  masker.forget(g.get());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto g = tandem::grammar::parse_gbnf(text);
  if (g.ok() && !tandem::grammar::validate(*g.value()).ok()) std::abort();
  if (g.ok()) run_grammar(g.value(), text);
  const auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  auto gbnf = tandem::grammar::json_schema_to_gbnf(schema, "p-");
  auto from_schema = tandem::grammar::grammar_from_json_schema(schema);
  if (gbnf.ok() != from_schema.ok() && from_schema.error().message.find("left recursion") == std::string::npos &&
      from_schema.error().message.find("GrammarLimits") == std::string::npos)
    std::abort();  // a schema that converts must give a usable grammar, short of recursion or limits
  if (from_schema.ok() && !tandem::grammar::validate(*from_schema.value()).ok()) std::abort();
  if (from_schema.ok()) run_grammar(from_schema.value(), text);
  return 0;
}
