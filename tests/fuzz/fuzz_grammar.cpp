// libFuzzer entry point for the grammar front ends: any text must become a grammar or an error
// (never a crash, a hang or a blow-up past GrammarLimits). Text that is JSON is also read as a
// JSON Schema; a schema that converts must give GBNF that parses, and every grammar built must
// pass validate().
//   build-fuzz/tests/fuzz_grammar -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto g = tandem::grammar::parse_gbnf(text);
  if (g.ok() && !tandem::grammar::validate(*g.value()).ok()) std::abort();
  const auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  auto gbnf = tandem::grammar::json_schema_to_gbnf(schema, "p-");
  auto from_schema = tandem::grammar::grammar_from_json_schema(schema);
  if (gbnf.ok() != from_schema.ok() && from_schema.error().message.find("left recursion") == std::string::npos &&
      from_schema.error().message.find("GrammarLimits") == std::string::npos)
    std::abort();  // a schema that converts must give a usable grammar, short of recursion or limits
  if (from_schema.ok() && !tandem::grammar::validate(*from_schema.value()).ok()) std::abort();
  return 0;
}
