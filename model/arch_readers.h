// The model families tandem runs, and the reader that fills each one's ArchSpec.
#pragma once

#include <string>
#include <string_view>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "model/arch_spec.h"
#include "model/model_config.h"

namespace tandem {

// "llama, mistral, granite, qwen2, qwen3, gemma3, phi3": for error messages.
std::string supported_architectures();
bool is_supported_architecture(std::string_view arch);

// The spec of c.arch, read from f's metadata and tensor names (c: the shared
// hyper-parameters, already read). Error for an architecture outside the list.
Result<ArchSpec> read_arch_spec(const GgufFile& f, const ModelConfig& c);

// A mixture of experts' shape and routing from the arch.expert_* keys into s.moe, every layer
// from leading_dense_block_count on routed; `normalize`: the family renormalises the kept
// weights (arch_readers_moe.cpp).
Status read_experts(const GgufFile& f, const ModelConfig& c, bool normalize, ArchSpec& s);

}  // namespace tandem
