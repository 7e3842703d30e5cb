#include "engine/grammar/token_terminal.h"

#include <algorithm>
#include <bit>
#include <set>

#include "tokenizer/tokenizer.h"

namespace tandem::grammar {

std::string token_terminal_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += kTokenMark;
  out += text;
  out += kTokenMark;
  return out;
}

bool is_token_terminal(std::string_view bytes) {
  return bytes.size() >= 2 && bytes.front() == kTokenMark && bytes.back() == kTokenMark;
}

std::string grammar_token_bytes(const Tokenizer& tok, int32_t id) {
  std::string text = tok.token_to_piece(id, false);
  if (!text.empty()) {
    std::replace(text.begin(), text.end(), kTokenMark, kPlainMarkStandIn);
    return text;
  }
  const std::string special = tok.token_to_piece(id, true);
  return special.empty() ? std::string() : token_terminal_bytes(special);
}

namespace {

// The one byte a byte-set element matches, or -1 (a rule, or a set of several bytes).
int single_byte(const Element& e) {
  if (e.kind != Element::Kind::Bytes) return -1;
  int n = 0, b = -1;
  for (int w = 0; w < 4; w++) {
    n += std::popcount(e.bytes[w]);
    if (e.bytes[w]) b = w * 64 + std::countr_zero(e.bytes[w]);
  }
  return n == 1 ? b : -1;
}

// Where a terminal opens or closes: the GBNF front end writes each terminal whole into one
// sequence, and no text rule holds the byte.
bool is_mark(const Element& e) { return single_byte(e) == (uint8_t)kTokenMark; }

}  // namespace

std::vector<std::string> token_terminal_texts(const Grammar& g) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const Rule& rule : g.rules) {
    for (const Sequence& seq : rule.alternatives) {
      for (size_t i = 0; i < seq.size(); i++) {
        if (!is_mark(seq[i])) continue;
        std::string text;
        size_t j = i + 1;
        for (; j < seq.size() && !is_mark(seq[j]); j++) {
          const int b = single_byte(seq[j]);
          if (b < 0) break;
          text += (char)b;
        }
        if (j < seq.size() && is_mark(seq[j]) && !text.empty() && seen.insert(text).second) out.push_back(text);
        i = j;
      }
    }
  }
  return out;
}

Status check_token_terminals(const Grammar& g, const Tokenizer& tok) {
  for (const std::string& text : token_terminal_texts(g)) {
    const int32_t id = tok.vocab().find(text);
    if (id < 0 || grammar_token_bytes(tok, id) != token_terminal_bytes(text))
      return make_error("grammar ({}): names the token {}, which is not a control token of this model's vocabulary, so it "
                        "can never be written",
                        g.source, text);
  }
  return Status::Ok();
}

}  // namespace tandem::grammar
