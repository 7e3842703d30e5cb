// Where tests find data that may be absent on a user's fresh clone: ../shared and the model.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tandem::test {

inline std::string shared_dir() { return std::string(TANDEM_SOURCE_DIR) + "/../shared"; }

// The default model: $TANDEM_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/setup.sh).
inline std::string default_model_path() {
  if (const char* env = std::getenv("TANDEM_MODEL")) return env;
  return std::string(TANDEM_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// The second bundled model: $TANDEM_GEMMA_MODEL, else models/gemma-3-270m-q4_k_m.gguf
// (scripts/setup.sh --models all).
inline std::string gemma_model_path() {
  if (const char* env = std::getenv("TANDEM_GEMMA_MODEL")) return env;
  return std::string(TANDEM_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
}

// gpt-oss's vocabulary (o200k_harmony) alone: $TANDEM_O200K_VOCAB, else
// models/o200k-harmony-vocab.gguf (tests/reference/make_o200k_tokens.py writes it).
inline std::string o200k_vocab_path() {
  if (const char* env = std::getenv("TANDEM_O200K_VOCAB")) return env;
  return std::string(TANDEM_SOURCE_DIR) + "/models/o200k-harmony-vocab.gguf";
}

inline bool exists(const std::string& p) { return std::filesystem::exists(p); }

}  // namespace tandem::test
