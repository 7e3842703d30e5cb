// Turns a request's generated tokens into the text a client sees: valid UTF-8 only (a
// character split across tokens is held until complete; bytes that cannot be UTF-8, and an
// incomplete character left when generation ends, become U+FFFD), and OpenAI-style stop
// strings: generation stops at the first occurrence of any, the stop string itself is not
// returned, and while streaming the tail that could still become a stop string is held back.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/utf8.h"

namespace tandem::server {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops);
  // Adds a token's bytes; returns the text now safe to send. Sets stopped() when a stop
  // string appeared (the text returned ends just before it).
  std::string push(const std::string& piece);
  // At the end: whatever was held back.
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that ended it ("" before one did): Anthropic's answer names it.
  const std::string& matched_stop() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  size_t hold_ = 0;  // longest stop string - 1
  Utf8Streamer utf8_;
  std::string pending_;  // decoded but not yet sent
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tandem::server
