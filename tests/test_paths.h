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

inline bool exists(const std::string& p) { return std::filesystem::exists(p); }

}  // namespace tandem::test
