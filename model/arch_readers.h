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

// What a mixture-of-experts family fixes (llama.cpp reads no key for these): whether the kept
// weights are renormalised, whether the top-k is taken before the softmax (over the raw
// logits), whether the expert width is read (expert_feed_forward_length, by default the FFN's
// width over the experts used; else the FFN's width), and whether a shared expert with a
// sigmoid gate runs beside the routed ones.
struct ExpertDefaults {
  bool normalize = false;
  bool softmax_over_top_k = false;
  bool read_width = true;
  bool shared_expert = false;
};

// A mixture of experts' shape and routing from the arch.expert_* keys into s.moe, every layer
// from leading_dense_block_count on routed (arch_readers_moe.cpp).
Status read_experts(const GgufFile& f, const ModelConfig& c, const ExpertDefaults& d, ArchSpec& s);

}  // namespace tandem
