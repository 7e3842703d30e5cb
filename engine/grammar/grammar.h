// A context-free grammar over bytes: what constrained decoding (engine/grammar/) enforces.
// Front ends produce it: a GBNF text (gbnf_parser.h), a JSON Schema (json_schema.h), "any JSON
// object". The matcher (matcher.h) runs it byte by byte, and the token masker (token_mask.h)
// turns a matcher state into the set of vocabulary tokens that can come next.
//
// Everything is bytes, not code points: a character class over Unicode is compiled into
// alternatives of UTF-8 byte sequences (utf8_class_sequences), so a token that ends inside a
// multi-byte character is judged by exactly the bytes it holds.
//
// Repetition (*, +, ?, {m,n}) is lowered by the front ends into helper rules, so the IR has only
// sequences and alternatives. A Grammar is immutable once built and shared by every request that
// uses it (std::shared_ptr<const Grammar>).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem::grammar {

// One element of a sequence: a set of bytes (one byte from it), or a reference to a rule.
struct Element {
  enum class Kind : uint8_t { Bytes, Rule };
  Kind kind = Kind::Bytes;
  std::array<uint64_t, 4> bytes{};  // Bytes: bit b set <=> byte b matches
  int32_t rule = -1;                // Rule: index into Grammar::rules

  static Element byte_set(const std::array<uint64_t, 4>& set) { return Element{Kind::Bytes, set, -1}; }
  static Element byte(uint8_t b) {
    Element e;
    e.bytes[b >> 6] |= 1ull << (b & 63);
    return e;
  }
  static Element byte_range(uint8_t lo, uint8_t hi) {  // inclusive
    Element e;
    for (unsigned b = lo; b <= hi; b++) e.bytes[b >> 6] |= 1ull << (b & 63);
    return e;
  }
  static Element ref(int32_t rule) { return Element{Kind::Rule, {}, rule}; }
  bool matches(uint8_t b) const { return (bytes[b >> 6] >> (b & 63)) & 1; }
};

using Sequence = std::vector<Element>;  // empty: matches the empty string

struct Rule {
  std::string name;                    // for messages ("root", "string", "item-3", ...)
  std::vector<Sequence> alternatives;  // at least one
};

struct Grammar {
  std::vector<Rule> rules;
  int32_t root = 0;
  std::string source;  // where it came from, for messages ("GBNF", "JSON Schema", "any JSON object")
};

// Limits every front end and the matcher enforce, so a hostile grammar or schema is an error,
// not a hang or an out-of-memory: rules after lowering, elements in all sequences, and the
// nesting of the text a front end parses (GBNF groups, schema objects).
struct GrammarLimits {
  size_t max_rules = 20000;
  size_t max_elements = 200000;
  int max_nesting = 64;
  size_t max_repeat = 1000;  // the largest m or n of {m,n} (or minItems/maxItems, minLength/maxLength)
};

// Checks a built grammar: every rule reference in range, every rule with an alternative, no
// left recursion (a rule that can reach itself again without consuming a byte: the matcher's
// stack would grow forever), the root in range, within `limits`. The error names the rule.
Status validate(const Grammar& g, const GrammarLimits& limits = {});

// The pieces of validate() a front end uses for messages of its own. nullable_rules: which rules
// can match the empty string. left_recursion_cycle: a cycle of rules each calling the next before
// consuming a byte (first == last), or empty when there is none; describe_cycle names it
// ("a -> b -> a"). References out of range are treated as matching nothing.
std::vector<bool> nullable_rules(const Grammar& g);
std::vector<int32_t> left_recursion_cycle(const Grammar& g);
std::string describe_cycle(const Grammar& g, const std::vector<int32_t>& cycle);

// The UTF-8 byte sequences of code points in [lo, hi] (inclusive, surrogates excluded), as a
// few sequences of byte-set elements: e.g. [U+0080, U+07FF] is one sequence [C2-DF][80-BF].
// Front ends use it to lower character classes; a class is the alternatives of its ranges'
// sequences.
std::vector<Sequence> utf8_class_sequences(uint32_t lo, uint32_t hi);

}  // namespace tandem::grammar
