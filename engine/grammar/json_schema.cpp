// JSON Schema -> GBNF text. Each schema node becomes a GBNF body (alternatives); nodes that are
// not a single token get a rule of their own, named after where they sit ("root-address-city").
// $ref targets become one rule each, made on first use, so recursive schemas (trees, linked
// lists) are recursive rules. Objects keep the schema's property order: a chain of rules lets
// each optional property be present or absent with the commas right, in O(properties) rules.
#include "engine/grammar/json_schema.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "engine/grammar/gbnf_parser.h"

namespace tandem::grammar {
namespace {

using nlohmann::ordered_json;

// The rules every schema shares ({P} stands for the prefix), emitted when used.
// ws: between tokens, nothing, one space, or a newline and up to 20 spaces (pretty-printed JSON
// to a depth of ten at two spaces); bounded, so a model cannot spend its answer on whitespace.
// integer/number: JSON's syntax (no leading zeros) with at most 16 digits before and after the
// point and 3 in the exponent, enough for any double or 64-bit integer, bounded for the same reason.
constexpr const char* kCommonRules[][2] = {
    {"ws", "( \" \" | \"\\n\" \" \"{0,20} )?"},
    {"char", R"gbnf([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ))gbnf"},
    {"string", R"gbnf("\"" {P}char* "\"")gbnf"},
    {"integer", R"gbnf("-"? ( "0" | [1-9] [0-9]{0,15} ))gbnf"},
    {"number", R"gbnf({P}integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?)gbnf"},
    {"boolean", R"gbnf("true" | "false")gbnf"},
    {"null", R"gbnf("null")gbnf"},
    {"value", R"gbnf({P}object | {P}array | {P}string | {P}number | {P}boolean | {P}null)gbnf"},
    {"member", R"gbnf({P}string {P}ws ":" {P}ws {P}value {P}ws)gbnf"},
    {"object", R"gbnf("{" {P}ws ( {P}member ( "," {P}ws {P}member )* )? "}")gbnf"},
    {"array", R"gbnf("[" {P}ws ( {P}value {P}ws ( "," {P}ws {P}value {P}ws )* )? "]")gbnf"},
};

// Keywords that only annotate (no effect on what is valid).
const std::set<std::string> kAnnotations = {"description", "title",    "$comment", "examples", "default",
                                            "deprecated",  "readOnly", "writeOnly", "$schema"};
// Keywords this converter honours; the type each applies to ("" for any).
const std::map<std::string, std::string> kSupported = {
    {"type", ""},          {"enum", ""},          {"const", ""},         {"anyOf", ""},
    {"oneOf", ""},         {"allOf", ""},         {"$ref", ""},          {"$defs", ""},         {"definitions", ""},
    {"properties", "object"}, {"required", "object"}, {"additionalProperties", "object"},
    {"items", "array"},    {"minItems", "array"}, {"maxItems", "array"},
    {"minLength", "string"}, {"maxLength", "string"},
};
const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};

std::string pointer_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string show_path(const std::string& path) { return path.empty() ? "/" : path; }

// A GBNF literal for `bytes` (valid UTF-8): quotes, backslashes and control bytes escaped.
std::string gbnf_literal(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02X}", c);
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

bool type_matches(const ordered_json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return d == static_cast<double>(static_cast<long long>(d));
  }
  return false;
}

// Whether `v` nests arrays/objects more than `limit` deep; recursion stops at the limit.
bool deeper_than(const ordered_json& v, int limit) {
  if (!v.is_structured()) return false;
  if (limit <= 0) return true;
  for (const auto& e : v) {
    if (deeper_than(e, limit - 1)) return true;
  }
  return false;
}

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok) out += c;
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  if (out.size() > 40) out.resize(40);
  return out.empty() ? "x" : out;
}

// A node's GBNF: its body, and whether the body is one token usable inline as an element.
struct Body {
  std::string text;
  bool simple = false;
};

class SchemaConverter {
 public:
  SchemaConverter(const ordered_json& root, std::string prefix, const GrammarLimits& limits)
      : root_(root), prefix_(std::move(prefix)), limits_(limits) {}

  Result<std::string> convert() {
    for (char c : prefix_) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
      if (!ok) return make_error("JSON Schema: rule prefix '{}' may hold only letters, digits, '-' and '_'", prefix_);
    }
    for (const auto& common : kCommonRules) reserved_.insert(common[0]);
    reserved_.insert("root");
    if (root_.is_object() && root_.contains("$id") && !root_["$id"].is_string())
      return error("", "'$id' must be a string");
    auto body = visit(root_, "", "root", 0);
    if (!body.ok()) return body.error();
    std::string out = fmt::format("{}root ::= {}\n", prefix_, body->text);
    for (const auto& [name, text] : rules_) out += fmt::format("{}{} ::= {}\n", prefix_, name, text);
    for (const auto& common : kCommonRules) {
      if (!used_common_.count(common[0])) continue;
      std::string text = common[1];
      for (size_t at; (at = text.find("{P}")) != std::string::npos;) text.replace(at, 3, prefix_);
      out += fmt::format("{}{} ::= {}\n", prefix_, common[0], text);
    }
    return out;
  }

 private:
  Error error(const std::string& path, const std::string& message) const {
    return make_error("schema at {}: {}", show_path(path), message);
  }

  // A rule from the common set, marking it (and what it uses) for output.
  std::string common(const std::string& name) {
    if (used_common_.insert(name).second) {
      if (name == "string") common("char");
      if (name == "number") common("integer");
      if (name == "value") for (const char* n : {"object", "array", "string", "number", "boolean", "null"}) common(n);
      if (name == "member") for (const char* n : {"string", "ws", "value"}) common(n);
      if (name == "object") for (const char* n : {"ws", "member"}) common(n);
      if (name == "array") for (const char* n : {"ws", "value"}) common(n);
    }
    return prefix_ + name;
  }

  std::string unique_name(const std::string& hint) {
    std::string name = hint;
    for (int i = 2; reserved_.count(name); i++) name = fmt::format("{}-{}", hint, i);
    reserved_.insert(name);
    return name;
  }

  std::string add_rule(const std::string& hint, std::string body) {
    const std::string name = unique_name(hint);
    rules_.emplace_back(name, std::move(body));
    return prefix_ + name;
  }

  // An element for `body`: itself when one token, else a rule named after `hint`.
  std::string element(const Body& body, const std::string& hint) {
    return body.simple ? body.text : add_rule(hint, body.text);
  }

  Result<Body> visit(const ordered_json& schema, const std::string& path, const std::string& hint, int depth) {
    if (depth > limits_.max_nesting)
      return error(path, fmt::format("nested deeper than {} (GrammarLimits::max_nesting)", limits_.max_nesting));
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return Body{common("value"), true};
      return error(path, "the schema 'false' matches nothing");
    }
    if (!schema.is_object()) return error(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : schema.items()) {
      if (kAnnotations.count(key) || kSupported.count(key)) continue;
      if (key == "$id" && path.empty()) continue;
      std::string shown;
      if (value.is_primitive()) {
        shown = value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
        if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
        shown = " = " + shown;
      }
      return error(path, fmt::format("'{}'{} is not supported", key, shown));
    }
    for (const char* defs : {"$defs", "definitions"})
      if (schema.contains(defs) && !schema[defs].is_object()) return error(path, fmt::format("'{}' must be an object", defs));
    if (schema.contains("allOf")) return visit_all_of(schema, path, hint, depth);
    if (schema.contains("$ref")) return visit_ref(schema, path, depth);
    if (schema.contains("enum") || schema.contains("const")) return visit_enum(schema, path);
    if (schema.contains("anyOf") || schema.contains("oneOf")) return visit_any_of(schema, path, hint, depth);
    return visit_typed(schema, path, hint, depth);
  }

  // Keywords other than annotations, $defs and `allowed`: what a combinator must stand alone from.
  Status only_alongside(const ordered_json& schema, const std::string& path, const std::string& keyword,
                        const std::set<std::string>& allowed) {
    for (const auto& [key, value] : schema.items()) {
      if (key == keyword || kAnnotations.count(key) || allowed.count(key) || key == "$defs" || key == "definitions" ||
          (key == "$id" && path.empty()))
        continue;
      return error(path, fmt::format("'{}' alongside '{}' is not supported", key, keyword));
    }
    return Status::Ok();
  }

  // allOf of one schema is that schema (pydantic writes a described $ref so); an intersection
  // of several is not something a grammar can build in general.
  Result<Body> visit_all_of(const ordered_json& schema, const std::string& path, const std::string& hint, int depth) {
    TANDEM_TRY(only_alongside(schema, path, "allOf", {}));
    const ordered_json& parts = schema["allOf"];
    if (!parts.is_array() || parts.size() != 1)
      return error(path, "'allOf' is supported with exactly one schema (an intersection of several is not)");
    return visit(parts[0], path + "/allOf/0", hint, depth + 1);
  }

  Result<Body> visit_ref(const ordered_json& schema, const std::string& path, int depth) {
    TANDEM_TRY(only_alongside(schema, path, "$ref", {}));
    if (!schema["$ref"].is_string()) return error(path, "'$ref' must be a string");
    const std::string ref = schema["$ref"].get<std::string>();
    auto known = refs_.find(ref);
    if (known != refs_.end()) return Body{known->second, true};
    if (ref.empty() || ref[0] != '#')
      return error(path, fmt::format("'$ref' = \"{}\": only references inside this schema (\"#/$defs/...\") are supported", ref));
    const ordered_json* target = nullptr;
    try {
      const ordered_json::json_pointer pointer(ref.substr(1));
      if (root_.contains(pointer)) target = &root_.at(pointer);
    } catch (const nlohmann::json::exception&) {
      target = nullptr;
    }
    if (target == nullptr) return error(path, fmt::format("'$ref' = \"{}\" points at nothing in the schema", ref));
    // Named before its body is built, so a reference inside the body to the same target (a
    // recursive schema) finds this rule.
    const size_t slash = ref.find_last_of('/');
    const std::string name = unique_name(ref == "#" ? "self" : "ref-" + sanitize(ref.substr(slash + 1)));
    refs_.emplace(ref, prefix_ + name);
    const size_t slot = rules_.size();
    rules_.emplace_back(name, "");
    auto body = visit(*target, ref.substr(1), name, depth + 1);
    if (!body.ok()) return body.error();
    rules_[slot].second = body->text;
    return Body{prefix_ + name, true};
  }

  Result<Body> visit_enum(const ordered_json& schema, const std::string& path) {
    const bool has_enum = schema.contains("enum"), has_const = schema.contains("const");
    TANDEM_TRY(only_alongside(schema, path, has_enum ? "enum" : "const", {"type", "enum", "const"}));
    std::vector<std::string> types;
    TANDEM_TRY(read_types(schema, path, types));
    // Values are compared and written recursively: bound their depth first.
    for (const char* key : {"enum", "const"})
      if (schema.contains(key) && deeper_than(schema[key], limits_.max_nesting))
        return error(path, fmt::format("'{}' holds values nested deeper than {} (GrammarLimits::max_nesting)", key,
                                       limits_.max_nesting));
    std::vector<ordered_json> values;
    if (has_enum) {
      if (!schema["enum"].is_array()) return error(path, "'enum' must be an array");
      for (const auto& v : schema["enum"]) values.push_back(v);
    }
    if (has_const) {
      if (has_enum) {
        std::vector<ordered_json> both;
        for (const auto& v : values)
          if (v == schema["const"]) both.push_back(v);
        values = std::move(both);
      } else {
        values.push_back(schema["const"]);
      }
    }
    std::vector<std::string> literals;
    std::set<std::string> seen;
    for (const auto& v : values) {
      bool typed = types.empty();
      for (const auto& t : types) typed = typed || type_matches(v, t);
      if (!typed) continue;
      std::string text;
      try {
        text = v.dump(-1, ' ', false, ordered_json::error_handler_t::strict);
      } catch (const nlohmann::json::exception&) {
        return error(path, "an enum or const value holds a string that is not valid UTF-8");
      }
      if (seen.insert(text).second) literals.push_back(gbnf_literal(text));
    }
    if (literals.empty()) return error(path, "no value of 'enum'/'const' satisfies the schema (check 'type')");
    return alternatives(literals);
  }

  Result<Body> visit_any_of(const ordered_json& schema, const std::string& path, const std::string& hint, int depth) {
    const std::string keyword = schema.contains("anyOf") ? "anyOf" : "oneOf";
    TANDEM_TRY(only_alongside(schema, path, keyword, {}));
    const ordered_json& branches = schema[keyword];
    if (!branches.is_array() || branches.empty()) return error(path, fmt::format("'{}' must be a non-empty array", keyword));
    std::vector<std::string> options;
    for (size_t i = 0; i < branches.size(); i++) {
      if (branches[i].is_boolean() && !branches[i].get<bool>()) continue;  // matches nothing: no alternative
      const std::string sub = fmt::format("{}/{}/{}", path, keyword, i);
      auto body = visit(branches[i], sub, fmt::format("{}-{}", hint, i), depth + 1);
      if (!body.ok()) return body.error();
      options.push_back(element(*body, fmt::format("{}-{}", hint, i)));
    }
    if (options.empty()) return error(path, fmt::format("every branch of '{}' is false", keyword));
    return alternatives(options);
  }

  static Body alternatives(const std::vector<std::string>& options) {
    if (options.size() == 1) return Body{options[0], true};
    std::string text;
    for (size_t i = 0; i < options.size(); i++) text += (i ? " | " : "") + options[i];
    return Body{text, false};
  }

  Status read_types(const ordered_json& schema, const std::string& path, std::vector<std::string>& types) {
    if (!schema.contains("type")) return Status::Ok();
    const ordered_json& t = schema["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const auto& e : t) {
        if (!e.is_string()) return error(path, "'type' must be a string or an array of strings");
        types.push_back(e.get<std::string>());
      }
    } else {
      return error(path, "'type' must be a string or a non-empty array of strings");
    }
    for (const auto& name : types)
      if (!kTypes.count(name)) return error(path, fmt::format("unknown type '{}'", name));
    return Status::Ok();
  }

  Result<Body> visit_typed(const ordered_json& schema, const std::string& path, const std::string& hint, int depth) {
    std::vector<std::string> types;
    TANDEM_TRY(read_types(schema, path, types));
    // Keywords of one type name the type when 'type' is absent ({"properties": ...} is an object).
    std::set<std::string> implied;
    for (const auto& [key, value] : schema.items()) {
      auto it = kSupported.find(key);
      if (it != kSupported.end() && !it->second.empty()) implied.insert(it->second);
    }
    if (types.empty()) {
      if (implied.empty()) return Body{common("value"), true};
      if (implied.size() > 1) return error(path, "keywords of several types and no 'type': add 'type'");
      types.push_back(*implied.begin());
    }
    for (const auto& [key, value] : schema.items()) {
      auto it = kSupported.find(key);
      if (it == kSupported.end() || it->second.empty()) continue;
      bool applies = false;
      for (const auto& t : types) applies = applies || t == it->second;
      if (!applies) return error(path, fmt::format("'{}' does not apply to type {}", key, ordered_json(types).dump()));
    }
    std::vector<std::string> options;
    for (const auto& t : types) {
      const std::string sub_hint = types.size() > 1 ? hint + "-" + t : hint;
      auto body = visit_type(schema, t, path, sub_hint, depth);
      if (!body.ok() || types.size() == 1) return body;
      options.push_back(element(*body, sub_hint));
    }
    return alternatives(options);
  }

  Result<Body> visit_type(const ordered_json& schema, const std::string& type, const std::string& path,
                          const std::string& hint, int depth) {
    if (type == "object") return visit_object(schema, path, hint, depth);
    if (type == "array") return visit_array(schema, path, hint, depth);
    if (type == "string") return visit_string(schema, path);
    return Body{common(type), true};
  }

  Result<size_t> read_count(const ordered_json& schema, const std::string& path, const char* key, size_t fallback) {
    if (!schema.contains(key)) return fallback;
    const ordered_json& v = schema[key];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      return error(path, fmt::format("'{}' must be a non-negative integer", key));
    const uint64_t n = v.get<uint64_t>();
    if (n > limits_.max_repeat)
      return error(path, fmt::format("'{}' = {} exceeds the limit of {} (GrammarLimits::max_repeat)", key, n, limits_.max_repeat));
    return static_cast<size_t>(n);
  }

  static std::string repeat_suffix(size_t min, size_t max) {
    if (max == SIZE_MAX) return min == 0 ? "*" : min == 1 ? "+" : fmt::format("{{{},}}", min);
    if (min == max) return fmt::format("{{{}}}", min);
    return fmt::format("{{{},{}}}", min, max);
  }

  Result<Body> visit_string(const ordered_json& schema, const std::string& path) {
    if (!schema.contains("minLength") && !schema.contains("maxLength")) return Body{common("string"), true};
    auto min = read_count(schema, path, "minLength", 0);
    if (!min.ok()) return min.error();
    auto max = read_count(schema, path, "maxLength", SIZE_MAX);
    if (!max.ok()) return max.error();
    if (max.value() < min.value()) return error(path, "'maxLength' is below 'minLength'");
    const std::string chars = max.value() == 0 ? "" : " " + common("char") + repeat_suffix(min.value(), max.value());
    return Body{fmt::format(R"("\""{} "\"")", chars), false};
  }

  Result<Body> visit_array(const ordered_json& schema, const std::string& path, const std::string& hint, int depth) {
    auto min = read_count(schema, path, "minItems", 0);
    if (!min.ok()) return min.error();
    auto max = read_count(schema, path, "maxItems", SIZE_MAX);
    if (!max.ok()) return max.error();
    if (max.value() < min.value()) return error(path, "'maxItems' is below 'minItems'");
    const std::string ws = common("ws");
    std::string item;
    if (!schema.contains("items") || schema["items"] == true) {
      item = common("value");
    } else if (schema["items"] == false) {
      if (min.value() > 0) return error(path, "'items' is false but 'minItems' asks for items");
      return Body{fmt::format(R"("[" {} "]")", ws), false};
    } else if (schema["items"].is_array()) {
      return error(path + "/items", "'items' as an array (tuple validation) is not supported");
    } else {
      auto body = visit(schema["items"], path + "/items", hint + "-item", depth + 1);
      if (!body.ok()) return body.error();
      item = element(*body, hint + "-item");
    }
    if (max.value() == 0) return Body{fmt::format(R"("[" {} "]")", ws), false};
    const size_t rest_min = min.value() == 0 ? 0 : min.value() - 1;
    const size_t rest_max = max.value() == SIZE_MAX ? SIZE_MAX : max.value() - 1;
    std::string rest = rest_max == 0 ? "" : fmt::format(R"( ( "," {} {} {} ){})", ws, item, ws, repeat_suffix(rest_min, rest_max));
    std::string items = fmt::format("{} {}{}", item, ws, rest);
    if (min.value() == 0) items = "( " + items + " )?";
    return Body{fmt::format(R"("[" {} {} "]")", ws, items), false};
  }

  Result<Body> visit_object(const ordered_json& schema, const std::string& path, const std::string& hint, int depth) {
    const ordered_json empty = ordered_json::object();
    const ordered_json& properties = schema.contains("properties") ? schema["properties"] : empty;
    if (!properties.is_object()) return error(path, "'properties' must be an object");
    std::set<std::string> required;
    if (schema.contains("required")) {
      if (!schema["required"].is_array()) return error(path, "'required' must be an array of strings");
      for (const auto& r : schema["required"]) {
        if (!r.is_string()) return error(path, "'required' must be an array of strings");
        if (!properties.contains(r.get<std::string>()))
          return error(path, fmt::format("required property '{}' is not in 'properties'", r.get<std::string>()));
        required.insert(r.get<std::string>());
      }
    }
    // Extra members: with no 'properties', any object (as JSON Schema reads {"type": "object"});
    // with 'properties', none unless additionalProperties says so (OpenAI's strict mode).
    std::string extra_value;
    if (schema.contains("additionalProperties")) {
      const ordered_json& ap = schema["additionalProperties"];
      if (ap == true) {
        extra_value = common("value");
      } else if (ap != false) {
        auto body = visit(ap, path + "/additionalProperties", hint + "-extra", depth + 1);
        if (!body.ok()) return body.error();
        extra_value = element(*body, hint + "-extra");
      }
    } else if (!schema.contains("properties")) {
      extra_value = common("value");
    }
    if (properties.empty() && extra_value == prefix_ + "value") return Body{common("object"), true};

    const std::string ws = common("ws");
    struct Member {
      std::string kv;  // the rule of `"name" ws ":" ws value ws`
      bool required;
    };
    std::vector<Member> members;
    for (const auto& [name, sub] : properties.items()) {
      const bool is_required = required.count(name) > 0;
      const std::string sub_path = path + "/properties/" + pointer_escape(name);
      if (sub.is_boolean() && !sub.get<bool>()) {
        if (is_required) return error(sub_path, "a required property whose schema is false can never be valid");
        continue;  // may not appear: leave it out
      }
      const std::string sub_hint = hint + "-" + sanitize(name);
      auto body = visit(sub, sub_path, sub_hint, depth + 1);
      if (!body.ok()) return body.error();
      const std::string value = element(*body, sub_hint);
      const std::string key = gbnf_literal(ordered_json(name).dump(-1, ' ', false, ordered_json::error_handler_t::replace));
      members.push_back({add_rule(sub_hint + "-kv", fmt::format(R"({} {} ":" {} {} {})", key, ws, ws, value, ws)),
                         is_required});
    }
    std::string extra_kv;
    if (!extra_value.empty())
      extra_kv = add_rule(hint + "-extra-kv", fmt::format(R"({} {} ":" {} {} {})", common("string"), ws, ws, extra_value, ws));

    // after[i]: members i.. when one has been written (each preceded by a comma);
    // first[i]: members i.. when none has been written yet, needed up to the first required one.
    const size_t n = members.size();
    size_t first_required = n;
    for (size_t i = 0; i < n && first_required == n; i++)
      if (members[i].required) first_required = i;
    std::string after, first;
    if (!extra_kv.empty()) {
      after = add_rule(hint + "-after-" + std::to_string(n), fmt::format(R"(( "," {} {} )*)", ws, extra_kv));
      first = add_rule(hint + "-first-" + std::to_string(n), fmt::format("( {} {} )?", extra_kv, after));
    }
    for (size_t i = n; i-- > 0;) {
      const Member& m = members[i];
      const std::string item = m.required ? fmt::format(R"("," {} {})", ws, m.kv) : fmt::format(R"(( "," {} {} )?)", ws, m.kv);
      const std::string this_first = m.kv + (after.empty() ? "" : " " + after);
      const std::string first_body = m.required ? this_first : this_first + " | " + (first.empty() ? "\"\"" : first);
      if (i <= first_required) first = add_rule(hint + "-first-" + std::to_string(i), first_body);
      if (i > 0) after = add_rule(hint + "-after-" + std::to_string(i), item + (after.empty() ? "" : " " + after));
    }
    return Body{fmt::format(R"("{{" {} {}"}}")", ws, first.empty() ? "" : first + " "), false};
  }

  const ordered_json& root_;
  std::string prefix_;
  GrammarLimits limits_;
  std::vector<std::pair<std::string, std::string>> rules_;  // (name without prefix, body)
  std::set<std::string> reserved_;
  std::set<std::string> used_common_;
  std::map<std::string, std::string> refs_;  // "$ref" value -> its rule
};

}  // namespace

Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema, const std::string& prefix,
                                        const GrammarLimits& limits) {
  return SchemaConverter(schema, prefix, limits).convert();
}

Result<std::shared_ptr<const Grammar>> grammar_from_json_schema(const nlohmann::ordered_json& schema,
                                                                const GrammarLimits& limits) {
  auto text = json_schema_to_gbnf(schema, "", limits);
  if (!text.ok()) return text.error();
  auto g = parse_gbnf(text.value(), limits);
  if (!g.ok()) return make_error("JSON Schema: the grammar it becomes is not usable: {}", g.error().message);
  auto with_source = std::make_shared<Grammar>(*g.value());
  with_source->source = "JSON Schema";
  return std::shared_ptr<const Grammar>(std::move(with_source));
}

std::shared_ptr<const Grammar> any_json_object_grammar() {
  static const std::shared_ptr<const Grammar> grammar = [] {
    auto g = grammar_from_json_schema(nlohmann::ordered_json{{"type", "object"}});
    if (!g.ok()) {
      // The schema is a constant: failing here is a bug in this file, caught by its tests.
      std::fprintf(stderr, "any_json_object_grammar: %s\n", g.error().message.c_str());
      std::abort();
    }
    auto with_source = std::make_shared<Grammar>(*g.value());
    with_source->source = "any JSON object";
    return std::shared_ptr<const Grammar>(std::move(with_source));
  }();
  return grammar;
}

}  // namespace tandem::grammar
