#include "chat/tool_calls.h"

#include <fmt/format.h>

#include "core/json_brackets.h"

namespace tandem {

namespace {

using ojson = nlohmann::ordered_json;

// Calls nest at most this deep: deeper output is text (nothing recursive walks it).
constexpr int kMaxCallDepth = 64;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) i++;
  return i;
}

bool starts_with(std::string_view s, size_t i, std::string_view prefix) { return s.substr(i, prefix.size()) == prefix; }

// Where the JSON object or array opening at s[i] ends (one past its closing bracket); TooDeep:
// *end is the bracket past the limit.
enum class JsonEnd { Complete, Incomplete, TooDeep };
JsonEnd json_value_end(std::string_view s, size_t i, size_t* end) {
  const JsonBrackets b = scan_json_brackets(s, i, kMaxCallDepth, true);
  if (b.too_deep != std::string::npos) return *end = b.too_deep, JsonEnd::TooDeep;
  if (b.end != std::string::npos) return *end = b.end, JsonEnd::Complete;
  return JsonEnd::Incomplete;
}

}  // namespace

bool tool_call_from_json(const ojson& j, ToolCall* call) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) return false;
  const ojson* args = nullptr;
  if (j.contains("arguments")) args = &j["arguments"];
  else if (j.contains("parameters")) args = &j["parameters"];
  ojson obj = ojson::object();
  if (args && args->is_string()) {  // a string that encodes an object (some models quote their arguments)
    const std::string& text = args->get_ref<const std::string&>();
    const size_t start = skip_space(text, 0);
    size_t end = 0;
    if (start == text.size() || text[start] != '{' || json_value_end(text, start, &end) != JsonEnd::Complete) return false;
    obj = ojson::parse(text, nullptr, false);
    if (obj.is_discarded() || !obj.is_object()) return false;
  } else if (args && args->is_object()) {
    obj = *args;
  } else if (args && !args->is_null()) {
    return false;
  }
  call->name = j["name"].get<std::string>();
  call->arguments = obj.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return true;
}

namespace {

// One call object, or (Mistral) an array of them: all must be calls.
bool calls_from_text(std::string_view text, bool array_ok, std::vector<ToolCall>* calls) {
  const ojson j = ojson::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return false;
  std::vector<ToolCall> out;
  if (j.is_array() && array_ok) {
    if (j.empty()) return false;
    for (const auto& e : j) {
      ToolCall c;
      if (!tool_call_from_json(e, &c)) return false;
      out.push_back(std::move(c));
    }
  } else {
    ToolCall c;
    if (!tool_call_from_json(j, &c)) return false;
    out.push_back(std::move(c));
  }
  *calls = std::move(out);
  return true;
}

const char* marker_of(ToolCallFamily f) {
  switch (f) {
    case ToolCallFamily::Hermes: return "<tool_call>";
    case ToolCallFamily::Llama3: return "<|python_tag|>";
    case ToolCallFamily::Mistral: return "[TOOL_CALLS]";
    case ToolCallFamily::Generic: return "";
  }
  return "";
}

constexpr std::string_view kHermesClose = "</tool_call>";

// The first full occurrence of `marker` in s, or where a suffix of s begins that is a proper
// prefix of it (the marker may be arriving); npos when neither. *full says which.
size_t find_marker(std::string_view s, std::string_view marker, bool* full) {
  const size_t at = s.find(marker);
  const size_t from = s.size() > marker.size() ? s.size() - marker.size() + 1 : 0;
  for (size_t i = from; i < s.size() && i < at; i++) {
    if (marker.substr(0, s.size() - i) == s.substr(i)) {
      *full = false;
      return i;
    }
  }
  *full = at != std::string_view::npos;
  return at;
}

}  // namespace

const char* tool_call_family_name(ToolCallFamily f) {
  switch (f) {
    case ToolCallFamily::Hermes: return "hermes";
    case ToolCallFamily::Llama3: return "llama3";
    case ToolCallFamily::Mistral: return "mistral";
    case ToolCallFamily::Generic: return "generic";
  }
  return "?";
}

bool template_reads_variable(std::string_view src, std::string_view name) {
  for (size_t i = 0; i + 1 < src.size(); i++) {
    if (src[i] != '{' || (src[i + 1] != '{' && src[i + 1] != '%')) continue;
    const char close = src[i + 1] == '{' ? '}' : '%';
    char prev = 0;  // the last non-space character in this block
    for (i += 2; i + 1 < src.size(); i++) {
      const char c = src[i];
      if (c == close && src[i + 1] == '}') break;
      if (c == '"' || c == '\'') {  // a string literal: skip it
        for (i++; i < src.size() && src[i] != c; i++)
          if (src[i] == '\\') i++;
        prev = c;
        continue;
      }
      if (is_ident(c) && !(c >= '0' && c <= '9')) {
        size_t j = i;
        while (j < src.size() && is_ident(src[j])) j++;
        if (src.substr(i, j - i) == name && prev != '.') return true;
        i = j - 1;
        prev = 'a';
        continue;
      }
      if (!is_space(c)) prev = c;
    }
  }
  return false;
}

ToolCallFormat detect_tool_call_format(std::string_view src, const Vocab* vocab) {
  ToolCallFormat f;
  f.accepts_tools = template_reads_variable(src, "tools");
  auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  auto in_vocab = [&](std::string_view s) { return vocab && vocab->find(s) >= 0; };
  if (has("<tool_call>")) f.family = ToolCallFamily::Hermes;
  else if (has("[TOOL_CALLS]")) f.family = ToolCallFamily::Mistral;
  else if (has("<|python_tag|>") || (has("\"parameters\"") && has("<|start_header_id|>"))) f.family = ToolCallFamily::Llama3;
  else if (in_vocab("<tool_call>")) f.family = ToolCallFamily::Hermes;
  else if (in_vocab("[TOOL_CALLS]")) f.family = ToolCallFamily::Mistral;
  else if (in_vocab("<|python_tag|>")) f.family = ToolCallFamily::Llama3;
  else f.family = ToolCallFamily::Hermes;
  return f;
}

std::vector<std::string> tool_call_markers(ToolCallFamily f) {
  if (f == ToolCallFamily::Generic) return {};
  if (f == ToolCallFamily::Hermes) return {"<tool_call>", std::string(kHermesClose)};
  return {marker_of(f)};
}

ToolCallStream::ToolCallStream(ToolCallFamily family, size_t max_calls)
    : family_(family), max_calls_(max_calls), bare_json_ok_(family == ToolCallFamily::Llama3) {}

ToolCallOutput ToolCallStream::push(std::string_view text) {
  ToolCallOutput out;
  if (saturated()) return out;
  buf_.append(text);
  process(false, &out);
  return out;
}

ToolCallOutput ToolCallStream::finish() {
  ToolCallOutput out;
  process(true, &out);
  out.content += ws_;  // trailing whitespace of text is kept (after a call none is held)
  ws_.clear();
  return out;
}

void ToolCallStream::emit_text(std::string_view s, ToolCallOutput* out) {
  for (char c : s) {
    if (is_space(c) || (after_call_ && c == ';' && family_ == ToolCallFamily::Llama3)) {
      if (!after_call_) ws_ += c;
      continue;
    }
    out->content += ws_;
    ws_.clear();
    out->content += c;
    after_call_ = false;
    bare_json_ok_ = false;
  }
}

void ToolCallStream::add_calls(std::vector<ToolCall> calls, ToolCallOutput* out) {
  ws_.clear();
  after_call_ = true;
  bare_json_ok_ = family_ == ToolCallFamily::Llama3;
  for (ToolCall& c : calls) {
    if (saturated()) break;
    out->calls.push_back(std::move(c));
    n_calls_++;
  }
}

void ToolCallStream::process(bool final, ToolCallOutput* out) {
  if (family_ == ToolCallFamily::Generic) return process_generic(final, out);  // chat/generic_tools.cpp
  const std::string_view marker = marker_of(family_);
  while (!buf_.empty()) {
    if (saturated()) {
      buf_.clear();
      return;
    }
    Segment seg;
    if (bare_json_ok_) {
      // Llama: at the start, or after a call, a '{' may open a call without a marker.
      size_t i = 0;
      while (i < buf_.size() && (is_space(buf_[i]) || (after_call_ && buf_[i] == ';'))) i++;
      emit_text(std::string_view(buf_).substr(0, i), out);
      buf_.erase(0, i);
      if (buf_.empty()) return;
      if (buf_[0] != '{') {
        bare_json_ok_ = false;
        continue;
      }
      seg = bare_json_segment(final);
    } else {
      bool full = false;
      const size_t at = find_marker(buf_, marker, &full);
      if (at == std::string::npos || (!full && final)) {
        emit_text(buf_, out);
        buf_.clear();
        return;
      }
      emit_text(std::string_view(buf_).substr(0, at), out);
      buf_.erase(0, at);
      if (!full) return;  // a marker may be arriving
      seg = marker_segment(final);
    }
    if (seg.step == Step::NeedMore) return;
    if (seg.step == Step::Calls) {
      add_calls(std::move(seg.calls), out);
    } else {
      // Not a call after all: the segment is text (its first byte at least, so this ends).
      emit_text(std::string_view(buf_).substr(0, std::max<size_t>(seg.length, 1)), out);
    }
    buf_.erase(0, std::max<size_t>(seg.length, 1));
  }
}

// A '{' where Llama may answer with a bare call.
ToolCallStream::Segment ToolCallStream::bare_json_segment(bool final) const {
  Segment seg;
  const size_t i = skip_space(buf_, 1);
  if (i == buf_.size()) {
    if (final) seg.step = Step::Text, seg.length = buf_.size();
    return seg;
  }
  if (buf_[i] != '"') return {Step::Text, 1, {}};  // not {"name": ...
  size_t end = 0;
  const JsonEnd e = json_value_end(buf_, 0, &end);
  if (e == JsonEnd::Incomplete) {
    if (final) seg.step = Step::Text, seg.length = buf_.size();
    return seg;
  }
  if (e == JsonEnd::TooDeep) return {Step::Text, end, {}};
  if (calls_from_text(std::string_view(buf_).substr(0, end), false, &seg.calls)) return {Step::Calls, end, std::move(seg.calls)};
  return {Step::Text, end, {}};
}

// buf_ starts with the family's marker.
ToolCallStream::Segment ToolCallStream::marker_segment(bool final) const {
  const std::string_view s = buf_;
  const size_t body = skip_space(s, std::string_view(marker_of(family_)).size());
  Segment need_more;
  const Segment all_text{Step::Text, s.size(), {}};
  if (body == s.size()) return final ? all_text : need_more;
  const bool hermes = family_ == ToolCallFamily::Hermes;
  // Hermes output that is not a call runs to its closing tag.
  auto hermes_text = [&]() -> Segment {
    const size_t close = s.find(kHermesClose, body);
    if (close == std::string_view::npos) return final ? all_text : need_more;
    return {Step::Text, close + kHermesClose.size(), {}};
  };
  const char open = s[body];
  if (family_ == ToolCallFamily::Mistral && (is_ident(open) || open == '-')) return mistral_args_segment(final);
  if (open != '{' && !(open == '[' && family_ == ToolCallFamily::Mistral))
    return hermes ? hermes_text() : Segment{Step::Text, body, {}};
  size_t end = 0;
  const JsonEnd e = json_value_end(s, body, &end);
  if (e == JsonEnd::TooDeep) return hermes ? hermes_text() : Segment{Step::Text, end, {}};
  // An open object holds everything after it (a closing tag may be inside one of its strings);
  // if it never closes, all of it is text.
  if (e == JsonEnd::Incomplete) return final ? all_text : need_more;
  std::vector<ToolCall> calls;
  const bool ok = calls_from_text(s.substr(body, end - body), family_ == ToolCallFamily::Mistral, &calls);
  if (!hermes) return ok ? Segment{Step::Calls, end, std::move(calls)} : Segment{Step::Text, end, {}};
  const size_t after = skip_space(s, end);
  const std::string_view rest = s.substr(after);
  if (starts_with(s, after, kHermesClose))
    return ok ? Segment{Step::Calls, after + kHermesClose.size(), std::move(calls)} : Segment{Step::Text, after + kHermesClose.size(), {}};
  if (kHermesClose.substr(0, rest.size()) == rest) {  // the closing tag may be arriving
    if (!final) return need_more;
    return ok ? Segment{Step::Calls, s.size(), std::move(calls)} : all_text;  // unterminated at the end: accepted
  }
  return hermes_text();
}

// Newer Mistral templates (Small 3.2, Magistral, Devstral): [TOOL_CALLS]name[ARGS]{...}, one
// marker per call.
ToolCallStream::Segment ToolCallStream::mistral_args_segment(bool final) const {
  const std::string_view s = buf_;
  const size_t name_at = std::string_view(marker_of(family_)).size();
  size_t i = name_at;
  while (i < s.size() && (is_ident(s[i]) || s[i] == '-')) i++;
  const Segment need_more, all_text{Step::Text, s.size(), {}};
  if (i == s.size()) return final ? all_text : need_more;
  constexpr std::string_view kArgs = "[ARGS]";
  const std::string_view rest = s.substr(i, kArgs.size());
  if (rest != kArgs) return kArgs.substr(0, rest.size()) == rest && !final ? need_more : Segment{Step::Text, i, {}};
  const size_t body = i + kArgs.size();
  if (body == s.size()) return final ? all_text : need_more;
  if (s[body] != '{') return {Step::Text, body, {}};
  size_t end = 0;
  const JsonEnd e = json_value_end(s, body, &end);
  if (e == JsonEnd::TooDeep) return {Step::Text, end, {}};
  if (e == JsonEnd::Incomplete) return final ? all_text : need_more;
  const ojson args = ojson::parse(s.begin() + body, s.begin() + end, nullptr, false);
  if (args.is_discarded() || !args.is_object()) return {Step::Text, end, {}};
  std::vector<ToolCall> calls(1);
  calls[0].name = std::string(s.substr(name_at, i - name_at));
  calls[0].arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return {Step::Calls, end, std::move(calls)};
}

ToolCallOutput parse_tool_calls(ToolCallFamily family, std::string_view text, size_t max_calls) {
  ToolCallStream stream(family, max_calls);
  ToolCallOutput out = stream.push(text);
  ToolCallOutput rest = stream.finish();
  out.content += rest.content;
  for (ToolCall& c : rest.calls) out.calls.push_back(std::move(c));
  return out;
}

std::string make_tool_call_id(ToolCallFamily family, std::mt19937_64& rng) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const int n = family == ToolCallFamily::Mistral ? 9 : 24;
  std::string id = family == ToolCallFamily::Mistral ? "" : "call_";
  for (int i = 0; i < n; i++) id += kAlnum[rng() % (sizeof(kAlnum) - 1)];
  return id;
}

ojson messages_for_template(const ojson& messages) {
  ojson out = messages;
  if (!out.is_array()) return out;
  for (auto& m : out) {
    // gpt-oss's template reads an earlier answer's reasoning as "thinking" (as llama.cpp passes it).
    if (m.is_object() && m.contains("reasoning_content") && m["reasoning_content"].is_string() && !m.contains("thinking"))
      m["thinking"] = m["reasoning_content"];
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      ojson& fn = call["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      const std::string& text = fn["arguments"].get_ref<const std::string&>();
      size_t end = 0;
      const size_t start = skip_space(text, 0);
      if (start == text.size() || text[start] != '{' || json_value_end(text, start, &end) != JsonEnd::Complete) continue;
      ojson args = ojson::parse(text, nullptr, false);
      if (!args.is_discarded() && args.is_object()) fn["arguments"] = std::move(args);
    }
  }
  return out;
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) out += fmt::format("\\x{:02x}", c);
    else out += (char)c;
  }
  return out + "\"";
}

std::string tool_call_gbnf(ToolCallFamily family, const std::vector<ToolGrammarFunction>& functions, bool parallel) {
  // The exact text the family's template writes for a past call, so the model continues in
  // its own format; Llama's templates allow one call per turn.
  std::string before, between, after, call_open, args_key, call_close;
  switch (family) {
    case ToolCallFamily::Hermes:
      call_open = "<tool_call>\n{\"name\": \"", args_key = "\", \"arguments\": ", call_close = "}\n</tool_call>";
      between = "\n";
      break;
    case ToolCallFamily::Llama3:
      call_open = "{\"name\": \"", args_key = "\", \"parameters\": ", call_close = "}";
      parallel = false;
      break;
    case ToolCallFamily::Mistral:
      before = "[TOOL_CALLS] [", after = "]";
      call_open = "{\"name\": \"", args_key = "\", \"arguments\": ", call_close = "}";
      between = ", ";
      break;
    case ToolCallFamily::Generic:  // its own grammar: generic_tool_gbnf
      break;
  }
  std::string g = "root ::= ";
  if (!before.empty()) g += gbnf_literal(before) + " ";
  g += "tool-call";
  // At most kMaxParallelCalls: a small model sampled freely may otherwise repeat a call until
  // its token limit.
  if (parallel) g += fmt::format(" ({} tool-call){{0,{}}}", gbnf_literal(between), kMaxParallelCalls - 1);
  if (!after.empty()) g += " " + gbnf_literal(after);
  g += "\ntool-call ::= ";
  for (size_t i = 0; i < functions.size(); i++) {
    if (i) g += "\n    | ";
    g += gbnf_literal(call_open + functions[i].name + args_key) + " " + functions[i].args_rule + " " + gbnf_literal(call_close);
  }
  return g + "\n";
}

}  // namespace tandem
