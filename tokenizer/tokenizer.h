// Text <-> token ids for a GGUF vocabulary: byte-level BPE with a regex pre-tokenizer
// (GPT-2, Llama 3, SmolLM, ...) or SentencePiece-style merges by score with byte fallback
// (Llama 2). Special tokens in the text are matched first when asked to.
// A Tokenizer is immutable once created: encode() and encode_chat() may run on many threads at
// once (each call owns its scratch, including the regex match data).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/rendered_prompt.h"
#include "tokenizer/special_trie.h"
#include "tokenizer/vocab.h"

namespace tandem {

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> create(Vocab vocab);
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& f);

  const Vocab& vocab() const { return vocab_; }

  // add_special: BOS/EOS as the vocabulary asks. parse_special: text like "<|im_start|>"
  // becomes its control token (user-defined tokens always match).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // A rendered chat template: special tokens parsed where the template wrote them, BOS added as
  // the vocabulary asks unless the template already wrote it (Llama 3, Gemma and Phi-3 templates
  // emit {{ bos_token }}). Bytes in prompt.data_spans came from the request: there only
  // user-defined tokens match (as in encode(..., parse_special = false)), so "<|im_end|>" typed
  // by a user stays text; allow_special_in_messages parses control tokens there too (the old,
  // forgeable behaviour, for callers who trust every message).
  std::vector<int32_t> encode_chat(const RenderedPrompt& prompt, bool allow_special_in_messages = false) const;

  // The bytes a token stands for; control tokens give their text only when `special`.
  std::string token_to_piece(int32_t id, bool special = false) const;
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

 private:
  explicit Tokenizer(Vocab v) : vocab_(std::move(v)) {}
  // encode() with special-token matching restricted to text outside `data` (null: none is data).
  std::vector<int32_t> encode_text(std::string_view text, bool add_special, bool parse_special, const ByteSpans* data) const;
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
  void encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, std::vector<int32_t>& out) const;
  void encode_spm_symbol(std::string_view symbol, std::vector<int32_t>& out) const;

  Vocab vocab_;
  std::unique_ptr<PreTokenizer> pre_;
  std::vector<int32_t> special_tokens_;  // control / user-defined / unknown, longest text first
  SpecialTrie special_trie_;             // finds which of special_tokens_ (by index) a text holds
  std::vector<std::string> byte_to_unicode_;  // GPT-2 byte-level alphabet (UTF-8 of each byte's stand-in)
  std::vector<int32_t> byte_tokens_;
  // SPM: no token holds a '▁' right after another character, so merges never cross the start
  // of a word and each word can be merged alone (a small heap instead of one per fragment).
  bool spm_words_independent_ = false;          // SPM <0xXX> tokens, -1 when absent
};

}  // namespace tandem
