#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <memory>
#include <utility>

#include "tokenizer/utf8.h"

namespace tandem {

namespace {

// The regexes come from each model's tokenizer.json (its "pre_tokenizer" Split patterns), as
// llama.cpp names them by tokenizer.ggml.pre. PCRE2 runs the originals directly, including
// (?i:...) and \p{Lu}-style classes. Non-ASCII code points are written \x{...}: the classes
// hold compatibility characters (U+212A KELVIN SIGN, ...) that Unicode normalisation would fold.

// GPT-2: contractions, letters, numbers, other symbols, whitespace.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
// Llama 3 (and most tiktoken-style vocabularies): case-insensitive contractions, numbers in
// groups of up to three, newlines kept apart.
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen 2: as Llama 3 with single digits.
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM: newlines alone, then letters of the cased scripts (an explicit class in the
// original), ASCII/fullwidth punctuation, trailing whitespace, CJK runs, numbers.
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr const char* kCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// Mistral's Tekken and GPT-4o: words split at case changes, contractions attached (GPT-4o).
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek V3 family: digits in threes, kana/CJK runs, then punctuation-led words.
constexpr const char* kDeepseek3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// BLOOM and relatives: a word is anything up to whitespace or sentence punctuation.
constexpr const char* kBloom = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";

struct Scheme {
  std::vector<std::string_view> names;
  std::vector<std::string> regexes;
};

const std::vector<Scheme>& schemes() {
  static const std::vector<Scheme> s = {
      // No tokenizer.ggml.pre: the generic BPE split llama.cpp uses for old conversions.
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
      {{"gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4", "jina-es", "jina-de",
        "jina-v2-es", "jina-v2-de", "jina-v1-en", "jina-v2-code", "roberta-bpe", "gigachat", "a.x-4.0", "mellum",
        "modern-bert"},
       {kGpt2}},
      {{"llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "chatglm-bpe", "glm4", "glm5"},
       {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "megrez", "kormo", "f2llmv2", "grok-2"}, {kQwen2}},
      // Digits split one by one, then the GPT-2 rules.
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
      {{"deepseek-llm"}, {R"([\r\n])", kDeepseekLetters, R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)", kCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}},
      {{"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"}, {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", kDeepseek3}},
      {{"tekken"}, {kTekken}},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}},
      {{"bloom", "poro-chat", "gpt3-finnish"}, {kBloom}},
      {{"viking"}, {kBloom, R"(\p{N})"}},
      {{"seed-coder"},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"bailingmoe", "bailingmoe2", "llada-moe"},
       {R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)"}},
      {{"chameleon"},
       {R"(<sentinel:[0-9]+>)", R"((IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z)", R"(([\t\n]|    |  ))", R"(\p{N})",
        R"([\p{P}!-/:-@\[-`{-~])", kGpt2}},
  };
  return s;
}

}  // namespace

std::vector<std::string> pretokenizer_regexes(std::string_view name) {
  for (const Scheme& s : schemes())
    for (auto n : s.names)
      if (n == name) return s.regexes;
  return {};
}

std::vector<std::string> pretokenizer_names() {
  std::vector<std::string> out;
  for (const Scheme& s : schemes())
    for (auto n : s.names) out.emplace_back(n);
  return out;
}

// The compiled pattern is immutable and shared by every thread; match data (the ovector that
// pcre2_match writes) belongs to one split() call, so any number of threads may split at once.
struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

struct MatchDataFree {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataFree>;

}  // namespace

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
    // DOLLAR_ENDONLY: `$` is the end of the piece, as in ECMAScript, not also before a final \n.
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &err, &off, nullptr);
    if (!c->code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      return make_error("pre-tokenizer regex /{}/ does not compile at offset {}: {}", re, off,
                        reinterpret_cast<const char*>(buf));
    }
    pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);  // best effort; interpreted matching also works
    p->regexes_.push_back(std::move(c));
  }
  return p;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces{text};
  if (text.empty()) return {};
  for (const auto& re : regexes_) {
    const MatchData match(pcre2_match_data_create_from_pattern(re->code, nullptr));
    if (!match) return pieces;  // out of memory: the pieces so far still tile the text
    std::vector<std::string_view> next;
    next.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0, gap = 0;
      while (pos < piece.size()) {
        const int rc = pcre2_match(re->code, subject, piece.size(), pos, 0, match.get(), nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
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
