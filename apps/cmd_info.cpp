// `tandem info`: what a GGUF file holds: metadata, tensors, and the model's shape and sizes.
#include <map>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "gguf/gguf_file.h"
#include "kv/kv_planner.h"
#include "model/model_config.h"

namespace tandem::apps {

Command add_info_command(CLI::App& app) {
  struct Args {
    std::string model;
    bool tensors = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("info", "Show a GGUF file's metadata, tensor types and model shape");
  sub->add_option("-m,--model", a->model, "GGUF file")->required();
  sub->add_flag("--tensors", a->tensors, "list every tensor");
  return [a]() -> int {
    auto f = GgufFile::open(a->model);
    if (!f.ok()) return fail(f.error().message);
    const GgufFile& g = *f.value();
    fmt::print("{}: GGUF v{}, {}, {} metadata keys, {} tensors, alignment {}\n", a->model, g.version(),
               human_bytes(g.file_size()), g.metadata().size(), g.tensors().size(), g.alignment());
    for (const auto& [k, v] : g.metadata()) fmt::print("  {:<44} {}\n", k, gguf_value_summary(v));
    std::map<std::string_view, std::pair<int, uint64_t>> by_type;
    for (const auto& t : g.tensors()) {
      by_type[t.type.name].first++;
      by_type[t.type.name].second += t.nbytes;
      if (a->tensors) {
        std::string dims;
        for (size_t i = 0; i < t.dims.size(); i++) dims += (i ? " x " : "") + std::to_string(t.dims[i]);
        fmt::print("  {:<32} {:<6} [{}] {}\n", t.name, t.type.name, dims, human_bytes(t.nbytes));
      }
    }
    for (const auto& [name, cb] : by_type) fmt::print("  tensors of {:<5} {:>4}  {}\n", name, cb.first, human_bytes(cb.second));
    auto c = ModelConfig::from_gguf(g);
    if (!c.ok()) {
      fmt::print("model: {}\n", c.error().message);
      return 0;
    }
    fmt::print("model: {} layers, hidden {}, {} heads ({} KV heads, head dim {}), ffn {}, vocab {}, context {}\n",
               c->n_layer, c->n_embd, c->n_head, c->n_kv_head, c->head_dim, c->n_ff, c->n_vocab, c->n_ctx_train);
    fmt::print("architecture {}\n", c->spec.describe());
    fmt::print("KV cache per token (f16): {} bytes; full context: {}\n",
               kv_cache_bytes(c->n_layer, c->n_kv_head, 1, c->head_dim, 2),
               human_bytes(kv_cache_bytes(c->n_layer, c->n_kv_head, c->n_ctx_train, c->head_dim, 2)));
    return 0;
  };
}

}  // namespace tandem::apps
