// JSON Schema -> grammar: accepted and rejected documents for each construct of the supported
// subset (checked with the test-only Earley recognizer), and the errors for everything else.
#include <gtest/gtest.h>

#include <string>

#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "grammar_recognizer.h"

namespace tandem::grammar {
namespace {

using nlohmann::ordered_json;

std::shared_ptr<const Grammar> schema_grammar(const std::string& schema) {
  auto g = grammar_from_json_schema(ordered_json::parse(schema));
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message) << "\n" << schema;
  if (g.ok()) {
    EXPECT_EQ(g.value()->source, "JSON Schema");
  }
  return g.ok() ? g.value() : nullptr;
}

std::string schema_error(const std::string& schema, const GrammarLimits& limits = {}) {
  auto g = grammar_from_json_schema(ordered_json::parse(schema), limits);
  EXPECT_FALSE(g.ok()) << "accepted: " << schema;
  return g.ok() ? "" : g.error().message;
}

void expect_documents(const std::string& schema, std::initializer_list<std::string> accepted,
                      std::initializer_list<std::string> rejected) {
  auto g = schema_grammar(schema);
  ASSERT_TRUE(g);
  for (const auto& doc : accepted) EXPECT_TRUE(test::earley_accepts(*g, doc)) << "should accept: " << doc << "\nschema: " << schema;
  for (const auto& doc : rejected) EXPECT_FALSE(test::earley_accepts(*g, doc)) << "should reject: " << doc << "\nschema: " << schema;
}

TEST(JsonSchema, RequiredAndOptionalPropertiesInSchemaOrder) {
  const std::string schema = R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["b"]})";
  expect_documents(schema,
                   {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"a":1,"b":"x","c":true})", R"({"b":"x","c":false})",
                    R"({ "a": -3, "b": "" })", "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"},
                   {"{}", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x",})", R"({"b":"x","d":1})",
                    R"({"a":1,,"b":"x"})", R"({"b":"x","b":"y"})", R"( {"b":"x"})", R"({"b":"x"} )", R"({"b":x})"});
}

TEST(JsonSchema, AllOptionalPropertiesMayAllBeOmitted) {
  expect_documents(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}, "c": {}}})",
                   {"{}", R"({"c":[1,{"x":"y"}]})", R"({"a":1,"c":true})", R"({"b":null})", R"({"a":1,"b":null,"c":"s"})"},
                   {R"({"c":1,"a":1})", R"({,"a":1})", R"({"a":1,})"});
}

TEST(JsonSchema, AllRequiredProperties) {
  expect_documents(R"({"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                       "required": ["x", "y"], "additionalProperties": false, "title": "Point"})",
                   {R"({"x":1,"y":2.5})", R"({"x" : 1 , "y" : -0.5e3})"}, {R"({"x":1})", R"({"y":1,"x":2})", "{}"});
}

TEST(JsonSchema, WhitespaceIsBounded) {
  auto g = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(test::earley_accepts(*g, "{\n" + std::string(20, ' ') + "\"a\":1}"));
  EXPECT_FALSE(test::earley_accepts(*g, "{\n" + std::string(21, ' ') + "\"a\":1}"));
  EXPECT_FALSE(test::earley_accepts(*g, "{  \"a\":1}"));
  EXPECT_FALSE(test::earley_accepts(*g, "{\n\n\"a\":1}"));
  EXPECT_FALSE(test::earley_accepts(*g, "{\t\"a\":1}"));
  EXPECT_FALSE(test::earley_accepts(*g, "{\r\n\"a\":1}"));
}

TEST(JsonSchema, StringsFollowJsonEscapesAndForbidRawControls) {
  expect_documents(R"({"type": "string"})",
                   {R"("")", R"("plain")", R"("q\"b\\s\/\b\f\n\r\t")", R"("\u00e9\uD83D\uDE00")", "\"\xC3\xA9\xF0\x9F\x98\x80\"",
                    "\"\x7F\""},
                   {R"("\x41")", R"("\u12")", R"("\uZZZZ")", "\"a\nb\"", "\"a\tb\"", std::string("\"\0\"", 3), R"("open)",
                    R"("a"b")", "\"\xC3\""});
}

TEST(JsonSchema, StringLengthBounds) {
  expect_documents(R"({"type": "string", "minLength": 2, "maxLength": 3})",
                   {R"("ab")", R"("abc")", R"("a\"c")", "\"\xC3\xA9\xC3\xA9\""}, {R"("a")", R"("abcd")", R"("")"});
  expect_documents(R"({"type": "string", "maxLength": 0})", {R"("")"}, {R"("a")"});
  expect_documents(R"({"type": "string", "minLength": 2})", {R"("ab")", R"("abcdefghij")"}, {R"("a")"});
}

TEST(JsonSchema, EnumOfStringsWithQuotesAndEscapes) {
  expect_documents(R"({"enum": ["say \"hi\"", "back\\slash", "é", "line\nbreak", 1, null, [1, 2], {"k": true}]})",
                   {R"("say \"hi\"")", R"("back\\slash")", "\"\xC3\xA9\"", R"("line\nbreak")", "1", "null", "[1,2]",
                    R"({"k":true})"},
                   {R"("say "hi"")", R"("other")", "\"line\nbreak\"", "2", "[1, 2]", R"("back\slash")"});
  // 'type' filters the values: only the strings remain.
  expect_documents(R"({"type": "string", "enum": ["a", 1, "b"]})", {R"("a")", R"("b")"}, {"1"});
  expect_documents(R"({"const": "fixed", "description": "a constant"})", {R"("fixed")"}, {R"("other")", "fixed"});
}

TEST(JsonSchema, NumbersAndIntegersFollowJsonSyntax) {
  expect_documents(R"({"type": "number"})", {"0", "-0", "1e5", "1.5E-3", "-12.25", "10", "0.0", "2e+10"},
                   {"01", "1.", ".5", "+1", "1e", "--1", "-", "0x10", "NaN", "1.5.2", "00"});
  expect_documents(R"({"type": "integer"})", {"0", "-0", "123", "-45", "1234567890123456"},
                   {"1.0", "1e5", "01", "-", "12345678901234567"});
}

TEST(JsonSchema, BooleansAndNulls) {
  expect_documents(R"({"type": "boolean"})", {"true", "false"}, {"True", "1", "null"});
  expect_documents(R"({"type": "null"})", {"null"}, {"nil", "\"null\""});
  expect_documents(R"({"type": ["string", "null"]})", {"null", R"("x")"}, {"1", "true"});
}

TEST(JsonSchema, ArraysWithItemBounds) {
  expect_documents(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
                   {"[1]", "[1,2,3]", "[ 1 , 2 ]", "[\n  1,\n  2\n]"}, {"[]", "[1,2,3,4]", "[1,]", "[,1]", "[\"a\"]"});
  expect_documents(R"({"type": "array", "items": {"type": "string"}})", {"[]", R"(["a","b","c","d","e"])"}, {"[1]", "["});
  expect_documents(R"({"type": "array", "maxItems": 0})", {"[]"}, {"[1]"});
  expect_documents(R"({"type": "array", "items": false})", {"[]", "[ ]"}, {"[1]"});
  expect_documents(R"({"type": "array", "minItems": 2})", {R"([1,"x"])", R"([{}, [], null])"}, {"[1]"});
  expect_documents(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2})",
                   {"[true,false]"}, {"[true]", "[true,true,true]"});
}

TEST(JsonSchema, AnyOfAndOneOf) {
  expect_documents(R"({"anyOf": [{"type": "string"}, {"type": "integer"}, false]})", {R"("x")", "5"}, {"true", "1.5"});
  expect_documents(R"({"oneOf": [{"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]},
                                 {"type": "array", "items": {"type": "null"}}]})",
                   {R"({"a":1})", "[null]", "[]"}, {R"({"a":2})", "[1]"});
}

TEST(JsonSchema, RecursiveRefBuildsATree) {
  const std::string tree = R"({
    "$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["value", "children"]}},
    "$ref": "#/$defs/node"})";
  expect_documents(tree,
                   {R"({"value":1,"children":[]})", R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]}]})"},
                   {R"({"value":1,"children":[{"value":2}]})", R"({"value":1})", R"({"value":1,"children":[1]})"});
  const std::string list = R"({"type": "object", "properties": {"head": {"type": "string"},
      "tail": {"anyOf": [{"$ref": "#/definitions/list"}, {"type": "null"}]}}, "required": ["head", "tail"],
    "definitions": {"list": {"type": "object", "properties": {"head": {"type": "string"},
      "tail": {"anyOf": [{"$ref": "#/definitions/list"}, {"type": "null"}]}}, "required": ["head", "tail"]}}})";
  expect_documents(list, {R"({"head":"a","tail":null})", R"({"head":"a","tail":{"head":"b","tail":null}})"},
                   {R"({"head":"a","tail":{"head":"b"}})"});
  // "#" refers to the whole schema.
  expect_documents(R"({"type": "array", "items": {"$ref": "#"}, "maxItems": 2})", {"[]", "[[],[[]]]"}, {"[1]", "[[],[],[]]"});
}

TEST(JsonSchema, AdditionalPropertiesTrueOrASchema) {
  expect_documents(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}})",
                   {R"({"a":1,"x":"y"})", R"({"x":"y","z":"w"})", "{}", R"({"a":1})"}, {R"({"x":1})", R"({"x":"y","a":1})"});
  expect_documents(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": true})",
                   {R"({"a":1,"x":[true]})", R"({"a":1})"}, {R"({"x":1})"});
  // No properties at all: any object, as JSON Schema reads {"type": "object"}.
  expect_documents(R"({"type": "object"})", {"{}", R"({"k":{"n":[1,2]}})"}, {"[]", R"({"k"})"});
}

TEST(JsonSchema, PropertyNamesNeedingEscapes) {
  expect_documents(R"({"type": "object", "properties": {"a \"q\"": {"type": "integer"}, "é/~": {"type": "integer"}},
                       "required": ["a \"q\"", "é/~"]})",
                   {"{\"a \\\"q\\\"\":1,\"\xC3\xA9/~\":2}"}, {R"({"a "q"":1,"é/~":2})"});
}

TEST(JsonSchema, AnyJsonObjectGrammar) {
  auto g = any_json_object_grammar();
  ASSERT_TRUE(g);
  EXPECT_EQ(g, any_json_object_grammar());  // built once, shared
  EXPECT_EQ(g->source, "any JSON object");
  for (std::string doc : {R"({})", R"({"a":[1,{"b":null}],"c":"d"})", "{\n  \"a\": 1.5e3,\n  \"b\": [true, false]\n}",
                          R"({"nested":{"deeper":{"deepest":[[[]]]}}})"})
    EXPECT_TRUE(test::earley_accepts(*g, doc)) << doc;
  for (const std::string& doc : std::vector<std::string>{"[1]", R"("x")", "1", "{", R"({"a":1,})", R"({"a"})", R"({'a':1})", " {}", "{} ",
                          "{\n" + std::string(21, ' ') + "}"})
    EXPECT_FALSE(test::earley_accepts(*g, doc)) << doc;
}

TEST(JsonSchema, PrefixNamesEveryRuleForSplicing) {
  auto text = json_schema_to_gbnf(ordered_json::parse(R"({"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]})"),
                                  "call-");
  ASSERT_TRUE(text.ok()) << text.error().message;
  std::string line;
  for (size_t start = 0; start < text->size();) {
    const size_t end = text->find('\n', start);
    line = text->substr(start, end - start);
    EXPECT_EQ(line.rfind("call-", 0), 0u) << line;
    start = end + 1;
  }
  auto g = parse_gbnf("root ::= \"<call>\" call-root \"</call>\"\n" + text.value());
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(test::earley_accepts(*g.value(), R"(<call>{"n":"x"}</call>)"));
  EXPECT_FALSE(test::earley_accepts(*g.value(), R"(<call>{}</call>)"));
  EXPECT_FALSE(json_schema_to_gbnf(ordered_json::object(), "bad prefix").ok());
}

void expect_schema_error(const std::string& schema, std::initializer_list<std::string> parts,
                         const GrammarLimits& limits = {}) {
  const std::string message = schema_error(schema, limits);
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message << "\nwants: " << part;
}

TEST(JsonSchemaErrors, UnsupportedKeywordsNameThemAndTheirPath) {
  expect_schema_error(R"({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}})",
                      {"schema at /properties/when", "'format' = \"date-time\" is not supported"});
  expect_schema_error(R"({"type": "array", "items": {"type": "object", "properties": {"a/b": {"type": "string", "pattern": "^x"}}}})",
                      {"schema at /items/properties/a~1b", "'pattern'"});
  expect_schema_error(R"({"type": "integer", "minimum": 0})", {"schema at /:", "'minimum' = 0 is not supported"});
  expect_schema_error(R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", {"'allOf' is supported with exactly one"});
  expect_schema_error(R"({"$defs": {"x": {"type": "string", "uniqueItems": true}}, "$ref": "#/$defs/x"})",
                      {"schema at /$defs/x", "'uniqueItems'"});
  expect_schema_error(R"({"type": "array", "prefixItems": [{"type": "string"}]})", {"'prefixItems'"});
  expect_schema_error(R"({"type": "array", "items": [{"type": "string"}]})", {"/items", "tuple"});
}

TEST(JsonSchemaErrors, InvalidOrUnsatisfiableSchemas) {
  expect_schema_error(R"({"$ref": "https://example.com/s.json"})", {"only references inside this schema"});
  expect_schema_error(R"({"$ref": "#/$defs/missing"})", {"points at nothing"});
  expect_schema_error(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})",
                      {"required property 'b' is not in 'properties'"});
  expect_schema_error(R"({"type": "integer", "minLength": 1})", {"'minLength' does not apply to type [\"integer\"]"});
  expect_schema_error(R"({"type": "strin"})", {"unknown type 'strin'"});
  expect_schema_error(R"({"type": "string", "minLength": 5, "maxLength": 2})", {"'maxLength' is below 'minLength'"});
  expect_schema_error(R"({"type": "string", "maxLength": -1})", {"non-negative integer"});
  expect_schema_error(R"({"type": "array", "maxItems": 5000})", {"'maxItems' = 5000 exceeds the limit of 1000"});
  expect_schema_error(R"({"type": "string", "enum": [1, 2]})", {"no value of 'enum'/'const'"});
  expect_schema_error(R"({"enum": ["a"], "minLength": 1})", {"'minLength' alongside 'enum'"});
  expect_schema_error(R"({"anyOf": [{"type": "string"}], "type": "string"})", {"'type' alongside 'anyOf'"});
  expect_schema_error(R"({"$ref": "#/$defs/a", "type": "object", "$defs": {"a": {}}})", {"'type' alongside '$ref'"});
  expect_schema_error("false", {"matches nothing"});
  expect_schema_error("[1]", {"must be an object or a boolean"});
  expect_schema_error(R"({"type": "object", "properties": {"a": false}, "required": ["a"]})", {"can never be valid"});
  // A reference that calls itself before any JSON text: left recursion in the grammar.
  expect_schema_error(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})",
                      {"left recursion"});
}

TEST(JsonSchemaErrors, DeepNestingIsAnErrorNotACrash) {
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 200; i++) deep = R"({"type": "array", "items": )" + deep + "}";
  expect_schema_error(deep, {"nested deeper than 64"});
  std::string refs = R"({"$defs": {)";
  for (int i = 0; i < 100; i++) refs += "\"d" + std::to_string(i) + "\": {\"$ref\": \"#/$defs/d" + std::to_string(i + 1) + "\"}, ";
  refs += R"("d100": {"type": "null"}}, "$ref": "#/$defs/d0"})";
  expect_schema_error(refs, {"nested deeper than 64"});
}

TEST(JsonSchema, AllOfOneSchemaIsThatSchema) {
  expect_documents(R"({"type": "object", "properties": {"c": {"allOf": [{"$ref": "#/$defs/Color"}], "description": "d"}},
                       "required": ["c"], "$defs": {"Color": {"enum": ["red", "green"], "type": "string"}}})",
                   {R"({"c":"red"})", R"({"c":"green"})"}, {R"({"c":"blue"})", "{}"});
}

TEST(JsonSchemaErrors, DeepEnumValuesAreAnErrorNotACrash) {
  std::string deep_value(100000, '[');
  deep_value += std::string(100000, ']');
  expect_schema_error(R"({"enum": [)" + deep_value + "]}", {"'enum' holds values nested deeper than 64"});
  expect_schema_error(R"({"const": )" + deep_value + "}", {"'const' holds values nested deeper than 64"});
}

TEST(JsonSchema, SchemaTrueAndEmptyAcceptAnyValue) {
  expect_documents("true", {"1", R"("s")", "[]", "{}", "null"}, {"", "nul"});
  expect_documents(R"({"description": "anything"})", {"1", R"({"a":[]})"}, {"x"});
}

}  // namespace
}  // namespace tandem::grammar
