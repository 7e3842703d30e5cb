// libFuzzer entry point for the tokenizer: any bytes (invalid UTF-8, special-token fragments,
// huge runs) must tokenize without a crash or hang, and byte-level BPE must round-trip them.
// The first input byte picks the vocabulary; the vectors in ../shared/tokenizer-vectors
// (or $TANDEM_FUZZ_VOCABS, colon-separated GGUF paths) are the vocabularies.
//   cmake -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON && cmake --build build-fuzz --target fuzz_tokenizer
//   build-fuzz/tests/fuzz_tokenizer -max_total_time=60 -max_len=4096
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

struct Loaded {
  std::unique_ptr<tandem::Tokenizer> tok;
  bool spells_every_byte;  // byte-level BPE whose 256 byte symbols are all plain tokens
};

bool spells_every_byte(const tandem::Tokenizer& t) {
  if (t.vocab().kind != tandem::VocabKind::Bpe) return false;
  for (int b = 0; b < 256; b++) {
    const std::string one(1, (char)b);
    if (t.decode(t.encode(one, false, false)) != one) return false;
  }
  return true;
}

std::vector<Loaded> load() {
  std::string paths;
  if (const char* env = std::getenv("TANDEM_FUZZ_VOCABS")) {
    paths = env;
  } else {
    const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/../shared/tokenizer-vectors/ggml-vocab-";
    for (const char* v : {"gpt-2", "llama-spm", "phi-3", "falcon", "mpt", "deepseek-llm"}) paths += dir + v + ".gguf:";
    // The bundled model (scripts/setup.sh fetches it): a vocabulary even where ../shared is absent.
    paths += std::string(TANDEM_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf:";
    // The second (setup.sh --models all): 262k SentencePiece tokens, 6,414 special ones.
    paths += std::string(TANDEM_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf:";
  }
  std::vector<Loaded> out;
  std::stringstream ss(paths);
  for (std::string p; std::getline(ss, p, ':');) {
    if (p.empty()) continue;
    auto f = tandem::GgufFile::open(p);
    if (!f.ok()) continue;
    auto t = tandem::Tokenizer::from_gguf(*f.value());
    if (!t.ok()) continue;
    const bool every = spells_every_byte(*t.value());
    out.push_back({std::move(t.value()), every});
  }
  if (out.empty()) {
    std::fprintf(stderr, "fuzz_tokenizer: no vocabulary loaded\n");
    std::abort();
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizers = load();
  if (size == 0) return 0;
  const Loaded& loaded = tokenizers[data[0] % tokenizers.size()];
  const tandem::Tokenizer& tok = *loaded.tok;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto ids = tok.encode(text, true, (data[0] & 0x80) != 0);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab().size()) std::abort();
  const std::string back = tok.decode(ids, true);
  // Byte-level BPE that spells every byte, without special parsing, gives valid UTF-8 back
  // (broken bytes become U+FFFD first, as in llama.cpp).
  if (loaded.spells_every_byte && !(data[0] & 0x80) && tandem::utf8_valid(text)) {
    const auto plain = tok.encode(text, false, false);
    if (tok.decode(plain) != text) std::abort();
  }
  return 0;
}
