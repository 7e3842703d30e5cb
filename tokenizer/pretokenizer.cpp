#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <utility>

#include "tokenizer/utf8.h"

namespace tandem {

namespace {

// The GPT-2 split: contractions, letters, numbers, other symbols, whitespace.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
// Llama 3: case-insensitive contractions, numbers in groups of up to three, newlines apart.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen 2: as Llama 3 with single digits.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Scheme {
  std::array<std::string_view, 12> names;
  std::vector<std::string> regexes;
};

const std::vector<Scheme>& schemes() {
  static const std::vector<Scheme> s = {
      {{"gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion"}, {kGpt2}},
      {{"llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe", "falcon3", "pixtral"}, {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan"}, {kQwen2}},
      // Digits split one by one, then the GPT-2 rules.
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}, {R"(\p{N})", kGpt2}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
  };
  return s;
}

}  // namespace

std::vector<std::string> pretokenizer_regexes(std::string_view name) {
  for (const Scheme& s : schemes())
    for (auto n : s.names)
      if (!n.empty() && n == name) return s.regexes;
  return {};
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;  // reused: split() is single-threaded per tokenizer
  ~Compiled() {
    if (match) pcre2_match_data_free(match);
    if (code) pcre2_code_free(code);
  }
};

PreTokenizer::~PreTokenizer() = default;

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::create(std::string_view name) {
  auto regexes = pretokenizer_regexes(name);
  if (regexes.empty()) return make_error("pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported", name);
  return from_regexes(regexes);
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::from_regexes(const std::vector<std::string>& regexes) {
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  for (const std::string& re : regexes) {
    auto c = std::make_unique<Compiled>();
    int err = 0;
    PCRE2_SIZE off = 0;
    // MATCH_INVALID_UTF: invalid bytes never match and fall into the gaps, instead of failing.
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!c->code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      return make_error("pre-tokenizer regex /{}/ does not compile at offset {}: {}", re, off,
                        reinterpret_cast<const char*>(buf));
    }
    pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);  // best effort; interpreted matching also works
    c->match = pcre2_match_data_create_from_pattern(c->code, nullptr);
    p->regexes_.push_back(std::move(c));
  }
  return p;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces{text};
  if (text.empty()) return {};
  for (const auto& re : regexes_) {
    std::vector<std::string_view> next;
    next.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0, gap = 0;
      while (pos < piece.size()) {
        const int rc = pcre2_match(re->code, subject, piece.size(), pos, 0, re->match, nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(re->match);
        const size_t s = ov[0], e = ov[1];
        if (e == s) {  // an empty match: step over one character
          pos = s + utf8_seq_len((unsigned char)piece[s]);
          continue;
        }
        if (s > gap) next.push_back(piece.substr(gap, s - gap));
        next.push_back(piece.substr(s, e - s));
        gap = pos = e;
      }
      if (gap < piece.size()) next.push_back(piece.substr(gap));
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace tandem
