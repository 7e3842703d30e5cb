// A GGUF file and its tokenizer, for tests that need a real vocabulary (and its template).
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace tandem::test {

struct LoadedVocab {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;  // null when the file is absent (the caller skips)
};

// Absent file: empty, for GTEST_SKIP. A file that is there but does not load fails the test.
inline LoadedVocab load_vocab(const std::string& path) {
  LoadedVocab v;
  if (!exists(path)) return v;
  auto f = GgufFile::open(path);
  if (!f.ok()) {
    ADD_FAILURE() << path << ": " << f.error().message;
    return v;
  }
  auto t = Tokenizer::from_gguf(*f.value());
  if (!t.ok()) {
    ADD_FAILURE() << path << ": " << t.error().message;
    return v;
  }
  v.file = std::move(f.value());
  v.tok = std::move(t.value());
  return v;
}

}  // namespace tandem::test
