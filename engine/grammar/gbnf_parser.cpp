// GBNF text -> the byte-level Grammar IR. A recursive-descent parser over rules, alternatives,
// sequences and postfix repetition; repetition is lowered here into helper rules (shared between
// uses of the same item, so `char{0,500}` in ten places builds one chain), character classes into
// UTF-8 byte sequences. Every size is bounded by GrammarLimits as it grows, so a hostile text
// fails with a message long before it could exhaust memory or time.
#include "engine/grammar/gbnf_parser.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "engine/grammar/token_terminal.h"

namespace tandem::grammar {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kUnbounded = SIZE_MAX;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(uint32_t cp, Sequence& out) {
  for (const Sequence& s : utf8_class_sequences(cp, cp))
    for (const Element& e : s) out.push_back(e);
}

// An element as a map key, for sharing repetition helpers between uses of the same item.
using ElementKey = std::tuple<int, uint64_t, uint64_t, uint64_t, uint64_t, int32_t>;
ElementKey key_of(const Element& e) {
  return {static_cast<int>(e.kind), e.bytes[0], e.bytes[1], e.bytes[2], e.bytes[3], e.rule};
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, const GrammarLimits& limits) : text_(text), limits_(limits) {
    grammar_.source = "GBNF";
  }

  Result<std::shared_ptr<const Grammar>> parse() {
    TANDEM_TRY(skip_space(true));
    while (pos_ < text_.size()) {
      TANDEM_TRY(parse_rule());
      TANDEM_TRY(skip_space(true));
    }
    TANDEM_TRY(check_complete());
    return std::make_shared<const Grammar>(std::move(grammar_));
  }

 private:
  // Per rule: where it was defined (user rules) or created (helpers), and the user rule it
  // belongs to, for messages.
  struct RuleInfo {
    size_t line = 0;
    std::string owner;
    bool user = false;
    bool defined = false;
  };
  // A `*` or `+` loop, checked once all rules are known: its item must not match the empty string.
  struct Loop {
    Element item;
    size_t line;
    std::string owner;
    char op;
  };

  Error error(std::string_view message) const {
    if (current_rule_.empty()) return make_error("GBNF line {}: {}", line_, message);
    return make_error("GBNF line {}, rule '{}': {}", line_, current_rule_, message);
  }

  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  bool at_end() const { return pos_ >= text_.size(); }

  // Spaces, tabs, carriage returns and comments; newlines too when `newline_ok` (inside groups,
  // after `::=` and `|`), since a newline otherwise ends the rule.
  Status skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r') {
        pos_++;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') pos_++;
      } else if (c == '\n' && newline_ok) {
        pos_++;
        line_++;
      } else {
        break;
      }
    }
    return Status::Ok();
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) pos_++;
    return std::string(text_.substr(start, pos_ - start));
  }

  Result<int32_t> add_rule(std::string name, const std::string& owner, bool user) {
    if (grammar_.rules.size() >= limits_.max_rules)
      return error(fmt::format("more than {} rules after lowering (GrammarLimits::max_rules)", limits_.max_rules));
    grammar_.rules.push_back(Rule{std::move(name), {}});
    info_.push_back(RuleInfo{line_, owner, user, !user});
    return static_cast<int32_t>(grammar_.rules.size() - 1);
  }

  Result<int32_t> add_helper(std::vector<Sequence> alternatives) {
    auto r = add_rule(fmt::format("{}-{}", current_rule_, ++helper_count_[current_rule_]), current_rule_, false);
    if (!r.ok()) return r.error();
    grammar_.rules[r.value()].alternatives = std::move(alternatives);
    return r.value();
  }

  Status push(Sequence& seq, const Element& e) {
    if (++elements_ > limits_.max_elements)
      return error(fmt::format("more than {} elements after lowering (GrammarLimits::max_elements)", limits_.max_elements));
    seq.push_back(e);
    return Status::Ok();
  }

  Result<int32_t> user_rule(const std::string& name) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return it->second;
    auto r = add_rule(name, name, true);
    if (!r.ok()) return r.error();
    by_name_.emplace(name, r.value());
    return r.value();
  }

  Status parse_rule() {
    current_rule_.clear();
    const std::string name = parse_name();
    if (name.empty())
      return error(fmt::format("expected a rule name, found '{}'", std::string(1, peek())));
    current_rule_ = name;
    TANDEM_TRY(skip_space(false));
    if (text_.substr(pos_, 3) != "::=") return error("expected '::=' after the rule name");
    pos_ += 3;
    auto index = user_rule(name);
    if (!index.ok()) return index.error();
    RuleInfo& info = info_[index.value()];
    if (info.defined) return error(fmt::format("rule '{}' is defined twice (first on line {})", name, info.line));
    info.defined = true;
    info.line = line_;
    TANDEM_TRY(skip_space(true));
    std::vector<Sequence> alternatives;
    TANDEM_TRY(parse_alternates(alternatives, false, 0));
    grammar_.rules[index.value()].alternatives = std::move(alternatives);
    if (!at_end() && peek() != '\n') return error(fmt::format("unexpected '{}'", std::string(1, peek())));
    return Status::Ok();
  }

  Status parse_alternates(std::vector<Sequence>& out, bool nested, int depth) {
    while (true) {
      Sequence seq;
      TANDEM_TRY(parse_sequence(seq, nested, depth));
      out.push_back(std::move(seq));
      if (peek() == '|') {
        pos_++;
        TANDEM_TRY(skip_space(true));
        continue;
      }
      if (!nested && peek() == '\n') {
        // A rule may go on with `|` at the start of a following line.
        const size_t save_pos = pos_, save_line = line_;
        TANDEM_TRY(skip_space(true));
        if (peek() == '|') {
          pos_++;
          TANDEM_TRY(skip_space(true));
          continue;
        }
        pos_ = save_pos;
        line_ = save_line;
      }
      return Status::Ok();
    }
  }

  Status parse_sequence(Sequence& out, bool nested, int depth) {
    size_t last_start = SIZE_MAX;  // where the last symbol's elements begin, for postfix operators
    while (true) {
      TANDEM_TRY(skip_space(nested));
      const char c = peek();
      if (at_end() || c == '|' || c == ')' || c == '\n') return Status::Ok();
      const size_t start = out.size();
      if (c == '"') {
        TANDEM_TRY(parse_literal(out));
      } else if (c == '[') {
        TANDEM_TRY(parse_class(out));
      } else if (c == '<') {
        TANDEM_TRY(parse_token(out));
      } else if (c == '!' && peek(1) == '<') {
        return error("a negated token (!<...>) is not supported: write the alternatives the grammar allows instead");
      } else if (c == '.') {
        pos_++;
        auto any = any_char_rule();
        if (!any.ok()) return any.error();
        TANDEM_TRY(push(out, Element::ref(any.value())));
      } else if (c == '(') {
        if (depth + 1 > limits_.max_nesting)
          return error(fmt::format("groups nested deeper than {} (GrammarLimits::max_nesting)", limits_.max_nesting));
        pos_++;
        TANDEM_TRY(skip_space(true));
        std::vector<Sequence> alternatives;
        TANDEM_TRY(parse_alternates(alternatives, true, depth + 1));
        TANDEM_TRY(skip_space(true));
        if (peek() != ')') return error("expected ')' to close the group");
        pos_++;
        auto r = add_helper(std::move(alternatives));
        if (!r.ok()) return r.error();
        TANDEM_TRY(push(out, Element::ref(r.value())));
      } else if (is_name_char(c)) {
        const size_t name_line = line_;
        const std::string name = parse_name();
        const size_t after = pos_;
        TANDEM_TRY(skip_space(false));
        if (text_.substr(pos_, 3) == "::=")
          return error(fmt::format("rule '{}' must start on a new line", name));
        pos_ = after;
        auto r = user_rule(name);
        if (!r.ok()) return r.error();
        if (!info_[r.value()].defined && !first_use_.count(r.value()))
          first_use_.emplace(r.value(), std::make_pair(name_line, current_rule_));
        TANDEM_TRY(push(out, Element::ref(r.value())));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last_start == SIZE_MAX || last_start > out.size())
          return error(fmt::format("'{}' follows nothing it could repeat", std::string(1, c)));
        TANDEM_TRY(parse_repetition(out, last_start));
        continue;  // the repeated symbol stays the last one (`x{2}?` repeats `x{2}`)
      } else {
        return error(fmt::format("unexpected '{}'", std::string(1, c)));
      }
      last_start = start;
    }
  }

  // One code point of a literal or class: an escape or a UTF-8 character.
  Result<uint32_t> parse_char() {
    const char c = peek();
    if (c == '\\') {
      const char e = peek(1);
      pos_ += e == '\0' ? 1 : 2;
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 't': return uint32_t{'\t'};
        case 'r': return uint32_t{'\r'};
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': return static_cast<uint32_t>(e);
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        default:
          return error(fmt::format("unknown escape '\\{}'", e == '\0' ? std::string() : std::string(1, e)));
      }
    }
    const auto b0 = static_cast<uint8_t>(c);
    const int len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || pos_ + len > text_.size()) return error("invalid UTF-8");
    uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int i = 1; i < len; i++) {
      const auto b = static_cast<uint8_t>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) return error("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
      return error("invalid UTF-8");
    pos_ += len;
    return cp;
  }

  Result<uint32_t> parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
      const int h = hex_value(peek());
      if (h < 0) return error(fmt::format("expected {} hex digits in the escape", digits));
      v = (v << 4) | static_cast<uint32_t>(h);
      pos_++;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
      return error(fmt::format("escape U+{:04X} is not a Unicode character", v));
    return v;
  }

  Status parse_literal(Sequence& out) {
    pos_++;  // "
    while (peek() != '"') {
      if (at_end() || peek() == '\n') return error("unterminated string literal");
      auto cp = parse_char();
      if (!cp.ok()) return cp.error();
      Sequence bytes;
      append_utf8(cp.value(), bytes);
      for (const Element& e : bytes) TANDEM_TRY(push(out, e));
    }
    pos_++;
    return Status::Ok();
  }

  Status parse_class(Sequence& out) {
    pos_++;  // [
    const bool negated = peek() == '^';
    if (negated) pos_++;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (peek() != ']') {
      if (at_end() || peek() == '\n') return error("unterminated character class");
      auto lo = parse_char();
      if (!lo.ok()) return lo.error();
      uint32_t hi = lo.value();
      if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
        pos_++;
        if (peek() == '\n') return error("unterminated character class");
        auto h = parse_char();
        if (!h.ok()) return h.error();
        hi = h.value();
        if (hi < lo.value())
          return error(fmt::format("character range U+{:04X}-U+{:04X} runs backwards", lo.value(), hi));
      }
      ranges.push_back({lo.value(), hi});
    }
    pos_++;
    if (ranges.empty()) return error("empty character class");
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, r.second);
      else merged.push_back(r);
    }
    if (negated) {
      std::vector<std::pair<uint32_t, uint32_t>> complement;
      uint32_t next = 0;
      for (const auto& r : merged) {
        if (r.first > next) complement.push_back({next, r.first - 1});
        next = r.second + 1;
      }
      if (next <= kMaxCodePoint) complement.push_back({next, kMaxCodePoint});
      merged = std::move(complement);
    }
    return push_class(merged, out);
  }

  // A token terminal: `<|channel|>` matches the one control token whose text is "<|channel|>"
  // (token_terminal.h); the brackets are part of the text, as in llama.cpp's grammars.
  Status parse_token(Sequence& out) {
    const size_t start = pos_;
    size_t end = pos_ + 1;
    while (end < text_.size() && text_[end] != '>' && text_[end] != '\n' && text_[end] != ' ' && text_[end] != '\t' &&
           text_[end] != '\r' && end - start < kMaxTokenTerminalText)
      end++;
    if (end >= text_.size() || text_[end] != '>') {
      if (end - start >= kMaxTokenTerminalText)
        return error(fmt::format("a token's text is longer than {} bytes", kMaxTokenTerminalText));
      return error("unterminated token: write a control token by its text in angle brackets, e.g. <|channel|>");
    }
    const std::string_view text = text_.substr(start, end + 1 - start);
    if (text.size() == 2) return error("empty token '<>'");
    if (text[1] == '[')
      return error(fmt::format("token ids ({}) are not supported: name the token by its text, e.g. <|channel|>", text));
    pos_ = end + 1;
    for (char b : token_terminal_bytes(text)) TANDEM_TRY(push(out, Element::byte((uint8_t)b)));
    return Status::Ok();
  }

  // A set of code point ranges as one byte-set element when it is all ASCII, else a helper rule
  // whose alternatives are the ASCII byte set and the multi-byte sequences.
  Status push_class(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, Sequence& out) {
    Element single;
    bool any_single = false;
    std::vector<Sequence> alternatives;
    for (const auto& [lo, hi] : ranges) {
      for (Sequence& s : utf8_class_sequences(lo, hi)) {
        if (s.size() == 1) {
          for (int w = 0; w < 4; w++) single.bytes[w] |= s[0].bytes[w];
          any_single = true;
        } else {
          alternatives.push_back(std::move(s));
        }
      }
    }
    if (any_single) alternatives.insert(alternatives.begin(), Sequence{single});
    if (alternatives.empty()) return error("character class matches no character");
    if (alternatives.size() == 1 && alternatives[0].size() == 1) return push(out, alternatives[0][0]);
    size_t n = 0;
    for (const Sequence& s : alternatives) n += s.size();
    if ((elements_ += n) > limits_.max_elements)
      return error(fmt::format("more than {} elements after lowering (GrammarLimits::max_elements)", limits_.max_elements));
    auto r = add_helper(std::move(alternatives));
    if (!r.ok()) return r.error();
    return push(out, Element::ref(r.value()));
  }

  Result<int32_t> any_char_rule() {
    if (any_char_ >= 0) return any_char_;
    Sequence tmp;
    TANDEM_TRY(push_class({{0, kMaxCodePoint}}, tmp));
    elements_--;  // `tmp` is thrown away; its reference is cached instead
    any_char_ = tmp[0].rule;
    return any_char_;
  }

  Result<size_t> parse_count() {
    const size_t start = pos_;
    size_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<size_t>(peek() - '0');
      pos_++;
      if (v > limits_.max_repeat)
        return error(fmt::format("repetition count {}... exceeds the limit of {} (GrammarLimits::max_repeat)",
                                 text_.substr(start, pos_ - start), limits_.max_repeat));
    }
    if (pos_ == start) return error("expected a number in '{...}'");
    return v;
  }

  Status parse_repetition(Sequence& out, size_t last_start) {
    const char op = peek();
    pos_++;
    size_t min = 0, max = kUnbounded;
    if (op == '+') min = 1;
    else if (op == '?') max = 1;
    else if (op == '{') {
      TANDEM_TRY(skip_space(false));
      auto m = parse_count();
      if (!m.ok()) return m.error();
      min = max = m.value();
      TANDEM_TRY(skip_space(false));
      if (peek() == ',') {
        pos_++;
        TANDEM_TRY(skip_space(false));
        max = kUnbounded;
        if (peek() != '}') {
          auto n = parse_count();
          if (!n.ok()) return n.error();
          max = n.value();
          TANDEM_TRY(skip_space(false));
        }
      }
      if (peek() != '}') return error("expected '}' to close the repetition");
      pos_++;
      if (max < min) return error(fmt::format("repetition {{{},{}}} has its maximum below its minimum", min, max));
    }
    // The last symbol becomes one element (a helper rule when it spans several, as a literal does).
    Sequence symbol(out.begin() + static_cast<ptrdiff_t>(last_start), out.end());
    out.resize(last_start);
    Element item;
    if (symbol.size() == 1) {
      item = symbol[0];
      elements_ -= 1;
    } else {
      // The symbol's elements move into the helper (counted already); an empty literal stays empty.
      if (symbol.empty()) return Status::Ok();
      auto r = add_helper({std::move(symbol)});
      if (!r.ok()) return r.error();
      item = Element::ref(r.value());
    }
    for (size_t i = 0; i < min; i++) TANDEM_TRY(push(out, item));
    if (max == kUnbounded) {
      auto loop = star_rule(item, op);
      if (!loop.ok()) return loop.error();
      TANDEM_TRY(push(out, Element::ref(loop.value())));
    } else if (max > min) {
      auto chain = optional_chain(item, max - min);
      if (!chain.ok()) return chain.error();
      TANDEM_TRY(push(out, Element::ref(chain.value())));
    }
    return Status::Ok();
  }

  // loop ::= item loop | (empty): right-recursive, so it never calls itself before `item`.
  Result<int32_t> star_rule(const Element& item, char op) {
    const ElementKey key = key_of(item);
    auto it = stars_.find(key);
    if (it != stars_.end()) return it->second;
    auto r = add_helper({});
    if (!r.ok()) return r.error();
    elements_ += 2;
    grammar_.rules[r.value()].alternatives = {Sequence{item, Element::ref(r.value())}, Sequence{}};
    stars_.emplace(key, r.value());
    loops_.push_back(Loop{item, line_, current_rule_, op});
    return r.value();
  }

  // Up to k more items as nested optionals: opt_k ::= item opt_(k-1) | (empty), opt_1 ::= item |
  // (empty). O(k) elements, and unambiguous: a matcher follows one path per count.
  Result<int32_t> optional_chain(const Element& item, size_t k) {
    std::vector<int32_t>& chain = chains_[key_of(item)];
    while (chain.size() < k) {
      Sequence with_item{item};
      if (!chain.empty()) with_item.push_back(Element::ref(chain.back()));
      elements_ += with_item.size();
      if (elements_ > limits_.max_elements)
        return error(fmt::format("more than {} elements after lowering (GrammarLimits::max_elements)", limits_.max_elements));
      auto r = add_helper({std::move(with_item), Sequence{}});
      if (!r.ok()) return r.error();
      chain.push_back(r.value());
    }
    return chain[k - 1];
  }

  Status check_complete() {
    for (size_t r = 0; r < grammar_.rules.size(); r++) {
      if (info_[r].defined) continue;
      const auto& [line, used_in] = first_use_.at(static_cast<int32_t>(r));
      return make_error("GBNF line {}, rule '{}': rule '{}' is used but never defined", line, used_in,
                        grammar_.rules[r].name);
    }
    auto root = by_name_.find("root");
    if (root == by_name_.end()) return make_error("GBNF: no rule named 'root' (the grammar's start)");
    grammar_.root = root->second;
    const std::vector<bool> nullable = nullable_rules(grammar_);
    for (const Loop& loop : loops_) {
      if (loop.item.kind == Element::Kind::Rule && nullable[loop.item.rule])
        return make_error(
            "GBNF line {}, rule '{}': the item repeated by '{}' can match the empty string, so the repetition "
            "could go on forever without consuming input; make the item non-empty",
            loop.line, loop.owner, loop.op);
    }
    const std::vector<int32_t> cycle = left_recursion_cycle(grammar_);
    if (!cycle.empty()) {
      const RuleInfo& at = info_[cycle.front()];
      return make_error(
          "GBNF line {}, rule '{}': left recursion ({}): a rule reaches itself again without consuming a byte; "
          "write it right-recursive (e.g. `list ::= item (\",\" list)?`) or with repetition",
          at.line, at.owner, describe_cycle(grammar_, cycle));
    }
    return validate(grammar_, limits_);
  }

  std::string_view text_;
  GrammarLimits limits_;
  size_t pos_ = 0;
  size_t line_ = 1;
  std::string current_rule_;
  Grammar grammar_;
  std::vector<RuleInfo> info_;  // parallel to grammar_.rules
  std::unordered_map<std::string, int32_t> by_name_;
  std::unordered_map<int32_t, std::pair<size_t, std::string>> first_use_;  // undefined rule -> (line, used in)
  std::unordered_map<std::string, int> helper_count_;
  std::map<ElementKey, int32_t> stars_;
  std::map<ElementKey, std::vector<int32_t>> chains_;
  std::vector<Loop> loops_;
  int32_t any_char_ = -1;
  size_t elements_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text, const GrammarLimits& limits) {
  return GbnfParser(text, limits).parse();
}

}  // namespace tandem::grammar
