// libFuzzer entry point for the GGUF parser and the model loader on top of it: any byte string
// must give a parsed file or an error, never a crash, hang or out-of-bounds read. The loader's
// checks of hyper-parameters against tensors run too (a file that passes them is loaded whole).
//   cmake -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON && cmake --build build-fuzz --target fuzz_gguf
//   build-fuzz/tests/fuzz_gguf -max_total_time=60 build-fuzz/tests/fuzz_seeds/fuzz_gguf  (scripts/fuzz.sh does this)
#include <cstddef>
#include <cstdint>

#include "gguf/gguf_file.h"
#include "model/model_config.h"
#include "model/model.h"
#include "tokenizer/vocab.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = tandem::GgufFile::from_bytes(data, size);
  if (!f.ok()) return 0;
  (void)tandem::ModelConfig::from_gguf(*f.value());
  (void)tandem::Vocab::from_gguf(*f.value());
  (void)tandem::Model::from_gguf(std::move(f.value()));
  return 0;
}
