// Regex pre-tokenizers for byte-level BPE (PCRE2 with Unicode properties). Each named scheme
// is a list of regexes applied in turn: every regex splits each piece so far into its matches
// and the text between them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace tandem {

class PreTokenizer {
 public:
  // name: the GGUF key tokenizer.ggml.pre (e.g. "gpt-2", "llama-bpe", "smollm"). An unknown
  // name is an error, never a silent fallback.
  static Result<std::unique_ptr<PreTokenizer>> create(std::string_view name);
  // Builds one from explicit regexes (tests).
  static Result<std::unique_ptr<PreTokenizer>> from_regexes(const std::vector<std::string>& regexes);
  ~PreTokenizer();

  std::vector<std::string_view> split(std::string_view text) const;

 private:
  PreTokenizer() = default;
  struct Compiled;
  std::vector<std::unique_ptr<Compiled>> regexes_;
};

// The regex list for a pre-tokenizer name; empty when unknown.
std::vector<std::string> pretokenizer_regexes(std::string_view name);
// Every tokenizer.ggml.pre name tandem supports.
std::vector<std::string> pretokenizer_names();

}  // namespace tandem
