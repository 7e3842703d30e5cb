// UTF-8 helpers for the tokenizers and for streaming text out token by token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Length of the UTF-8 sequence starting with byte c (1 for invalid lead bytes).
int utf8_seq_len(unsigned char c);
// Splits text into UTF-8 characters; an invalid byte becomes a one-byte piece.
std::vector<std::string_view> utf8_chars(std::string_view text);
// Splits by the length each lead byte announces, without validating (SentencePiece's and
// llama.cpp's SPM split: a broken sequence stays glued together and falls back to bytes).
std::vector<std::string_view> utf8_chars_by_lead(std::string_view text);
// True when every byte belongs to a well-formed sequence.
bool utf8_valid(std::string_view text);
// Each byte that starts no well-formed sequence becomes U+FFFD, as llama.cpp's decoder does
// before byte-level BPE (and as Python's errors="replace" does for Hugging Face tokenizers).
std::string utf8_replace_invalid(std::string_view text);
// Encodes one code point.
std::string utf8_encode(uint32_t cp);
// Decodes the code point at s[i] and advances i; invalid bytes decode to themselves as U+00XX.
uint32_t utf8_decode(std::string_view s, size_t& i);

// Holds back an incomplete trailing UTF-8 sequence so that streamed text never splits a
// character that spans two tokens.
class Utf8Streamer {
 public:
  // Appends bytes; returns the part that is now complete and safe to print.
  std::string push(std::string_view bytes);
  // Whatever is still held (an incomplete sequence at the end of generation).
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace tandem
