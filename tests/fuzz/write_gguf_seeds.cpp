// Writes the GGUF fuzzer's seed corpus: tiny valid Llama models (a few KB each) that pass every
// loader check, so mutations start from files that reach the model loader, not just the header.
//   write_gguf_seeds DIR
#include <cstdio>
#include <filesystem>
#include <string>

#include "model/model.h"
#include "tiny_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_gguf_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "write_gguf_seeds: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  struct Seed {
    const char* name;
    tandem::DType type;
    int n_embd;
    bool tied;
    const char* family = "llama";
  };
  // Every family's layout too, so mutations start from its keys and tensor names.
  for (const Seed& s : {Seed{"f32", tandem::DType::F32, 8, false}, Seed{"f32_tied", tandem::DType::F32, 8, true},
                        Seed{"f16", tandem::DType::F16, 8, false}, Seed{"q8_0", tandem::DType::Q8_0, 32, false},
                        Seed{"q4_0", tandem::DType::Q4_0, 32, true}, Seed{"qwen2", tandem::DType::F32, 8, true, "qwen2"},
                        Seed{"qwen3", tandem::DType::F32, 8, true, "qwen3"}, Seed{"gemma3", tandem::DType::F32, 8, true, "gemma3"},
                        Seed{"phi3", tandem::DType::F32, 8, false, "phi3"}, Seed{"granite", tandem::DType::F32, 8, true, "granite"}}) {
    tandem::test::TinyShape shape;
    shape.n_vocab = 12;
    shape.n_embd = s.n_embd;
    shape.n_layer = 1;
    shape.n_head = 2;
    shape.n_kv_head = 1;
    shape.n_ff = s.n_embd;
    shape.n_ctx = 32;
    shape.weight_type = s.type;
    shape.tied = s.tied;
    shape.family = s.family;
    if (shape.family == "gemma3") shape.window = 3;
    const auto bytes = tandem::test::tiny_model_bytes(shape);
    auto parsed = tandem::GgufFile::from_bytes(bytes.data(), bytes.size());
    auto model = parsed.ok() ? tandem::Model::from_gguf(std::move(parsed.value())) : parsed.error();
    if (!model.ok()) {  // a seed the loader refuses would only exercise its error paths
      std::fprintf(stderr, "write_gguf_seeds: seed %s does not load: %s\n", s.name, model.error().message.c_str());
      return 1;
    }
    const std::string path = (dir / (std::string(s.name) + ".gguf")).string();
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "write_gguf_seeds: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
