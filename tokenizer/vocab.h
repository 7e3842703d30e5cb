// A tokenizer vocabulary read from GGUF metadata (works on vocab-only files too).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "tokenizer/token_index.h"

namespace tandem {

enum class VocabKind { Bpe, Spm };  // tokenizer.ggml.model: "gpt2" / "llama"

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// Lets string-keyed maps be searched with a string_view, without building a std::string per
// lookup (the tokenizer's merge loop looks up millions of pairs per megabyte).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct Vocab {
  VocabKind kind = VocabKind::Bpe;
  std::string pre;  // tokenizer.ggml.pre ("default" when absent)
  std::vector<std::string> tokens;
  std::vector<float> scores;     // SPM merge priorities (empty for BPE)
  std::vector<TokenType> types;
  // Special tokens that eat the whitespace after them when matched in text. GGUF does not
  // carry Hugging Face's per-token "rstrip"; like llama.cpp, tandem sets it for Phi-3 models.
  std::vector<bool> rstrip;
  TokenIndex token_to_id;  // text -> id, first of duplicates
  StringMap merge_rank;  // "left right" -> rank (BPE)

  int32_t bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SPM: prepend a space to the text
  std::vector<int32_t> end_of_generation;  // eos, eot and template end markers

  int32_t size() const { return (int32_t)tokens.size(); }
  int32_t find(std::string_view text) const;  // -1 when absent
  bool is_eog(int32_t id) const;
  bool is_control(int32_t id) const { return types[id] == TokenType::Control; }
  // Appends a token (tests grow a real vocabulary with another family's markers); its id.
  int32_t add_token(const std::string& text, TokenType type);

  static Result<Vocab> from_gguf(const GgufFile& f);
};

}  // namespace tandem
