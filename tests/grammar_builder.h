// Grammars built by hand in tests (and the mask benchmark), without a front end: sequences of
// literal bytes, byte ranges and sets, and rule references, e.g.
//   GrammarBuilder b;
//   int32_t digits = b.rule("digits");
//   b.alt(digits, cat(range('0', '9'), ref(digits)));
//   b.alt(digits, {});
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/grammar.h"

namespace tandem::grammar::test {

using Seq = std::vector<Element>;

inline Seq lit(std::string_view s) {
  Seq seq;
  for (char c : s) seq.push_back(Element::byte((uint8_t)c));
  return seq;
}
inline Seq range(uint8_t lo, uint8_t hi) { return {Element::byte_range(lo, hi)}; }
inline Seq ref(int32_t rule) { return {Element::ref(rule)}; }
// One byte from `chars`, or (none_of) one byte not in it.
inline Seq any_of(std::string_view chars) {
  Element e;
  for (char c : chars) e.bytes[(uint8_t)c >> 6] |= 1ull << ((uint8_t)c & 63);
  return {e};
}
inline Seq none_of(std::string_view chars) {
  Element e = any_of(chars)[0];
  for (auto& w : e.bytes) w = ~w;
  return {e};
}
template <typename... Seqs>
Seq cat(Seqs... parts) {
  Seq out;
  (out.insert(out.end(), parts.begin(), parts.end()), ...);
  return out;
}

class GrammarBuilder {
 public:
  int32_t rule(std::string name) {
    g_.rules.push_back(Rule{std::move(name), {}});
    return (int32_t)g_.rules.size() - 1;
  }
  void alt(int32_t rule, Seq seq) { g_.rules[rule].alternatives.push_back(std::move(seq)); }
  std::shared_ptr<const Grammar> build(int32_t root) {
    g_.root = root;
    g_.source = "test";
    return std::make_shared<const Grammar>(g_);
  }

 private:
  Grammar g_;
};

// Any JSON object, written as llama.cpp's json.gbnf would be lowered: strings of any UTF-8
// character but '"', '\\' and control bytes, escapes \" \\ \/ \b \f \n \r \t \uXXXX, numbers,
// literals, and unbounded whitespace [ \t\n]*.
inline std::shared_ptr<const Grammar> json_object_grammar() {
  GrammarBuilder b;
  const int32_t root = b.rule("root"), value = b.rule("value"), object = b.rule("object"), members = b.rule("members"),
                array = b.rule("array"), elements = b.rule("elements"), string = b.rule("string"),
                chars = b.rule("chars"), chr = b.rule("char"), cont = b.rule("utf8-cont"), escape = b.rule("escape"),
                hex = b.rule("hex"), number = b.rule("number"), sign = b.rule("sign"), integer = b.rule("int"),
                digits = b.rule("digits"), frac = b.rule("frac"), exp = b.rule("exp"), ws = b.rule("ws");
  b.alt(root, ref(object));
  for (int32_t r : {object, array, string, number}) b.alt(value, ref(r));
  for (const char* l : {"true", "false", "null"}) b.alt(value, lit(l));
  b.alt(object, cat(lit("{"), ref(ws), lit("}")));
  b.alt(object, cat(lit("{"), ref(ws), ref(string), ref(ws), lit(":"), ref(ws), ref(value), ref(ws), ref(members), lit("}")));
  b.alt(members, cat(lit(","), ref(ws), ref(string), ref(ws), lit(":"), ref(ws), ref(value), ref(ws), ref(members)));
  b.alt(members, {});
  b.alt(array, cat(lit("["), ref(ws), lit("]")));
  b.alt(array, cat(lit("["), ref(ws), ref(value), ref(ws), ref(elements), lit("]")));
  b.alt(elements, cat(lit(","), ref(ws), ref(value), ref(ws), ref(elements)));
  b.alt(elements, {});
  b.alt(string, cat(lit("\""), ref(chars), lit("\"")));
  b.alt(chars, cat(ref(chr), ref(chars)));
  b.alt(chars, {});
  b.alt(chr, range(0x20, 0x21));  // ASCII but '"' (0x22) and '\\' (0x5C)
  b.alt(chr, range(0x23, 0x5B));
  b.alt(chr, range(0x5D, 0x7F));
  b.alt(chr, cat(lit("\\"), ref(escape)));
  // UTF-8 of U+0080..U+10FFFF without surrogates or overlong forms.
  b.alt(cont, range(0x80, 0xBF));
  b.alt(chr, cat(range(0xC2, 0xDF), ref(cont)));
  b.alt(chr, cat(lit("\xE0"), range(0xA0, 0xBF), ref(cont)));
  b.alt(chr, cat(range(0xE1, 0xEC), ref(cont), ref(cont)));
  b.alt(chr, cat(lit("\xED"), range(0x80, 0x9F), ref(cont)));
  b.alt(chr, cat(range(0xEE, 0xEF), ref(cont), ref(cont)));
  b.alt(chr, cat(lit("\xF0"), range(0x90, 0xBF), ref(cont), ref(cont)));
  b.alt(chr, cat(range(0xF1, 0xF3), ref(cont), ref(cont), ref(cont)));
  b.alt(chr, cat(lit("\xF4"), range(0x80, 0x8F), ref(cont), ref(cont)));
  b.alt(escape, any_of("\"\\/bfnrt"));
  b.alt(escape, cat(lit("u"), ref(hex), ref(hex), ref(hex), ref(hex)));
  b.alt(hex, range('0', '9'));
  b.alt(hex, range('a', 'f'));
  b.alt(hex, range('A', 'F'));
  b.alt(number, cat(ref(sign), ref(integer), ref(frac), ref(exp)));
  b.alt(sign, lit("-"));
  b.alt(sign, {});
  b.alt(integer, lit("0"));
  b.alt(integer, cat(range('1', '9'), ref(digits)));
  b.alt(digits, cat(range('0', '9'), ref(digits)));
  b.alt(digits, {});
  b.alt(frac, cat(lit("."), range('0', '9'), ref(digits)));
  b.alt(frac, {});
  b.alt(exp, cat(any_of("eE"), any_of("+-"), range('0', '9'), ref(digits)));
  b.alt(exp, cat(any_of("eE"), range('0', '9'), ref(digits)));
  b.alt(exp, {});
  b.alt(ws, cat(any_of(" \t\n"), ref(ws)));
  b.alt(ws, {});
  return b.build(root);
}

}  // namespace tandem::grammar::test
