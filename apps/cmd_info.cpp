// `tandem info`: what a GGUF file holds: metadata, tensors, and the model's shape and sizes.
#include <map>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "chat/chat_template.h"
#include "gguf/gguf_file.h"
#include "kv/kv_planner.h"
#include "model/model_config.h"
#include "model/param_count.h"
#include "tokenizer/tokenizer.h"

namespace tandem::apps {

namespace {

// The vocabulary's kind, size and markers, and which chat template `chat`/`serve` would use.
void print_tokenizer_and_template(const GgufFile& g) {
  auto tok = Tokenizer::from_gguf(g);
  if (!tok.ok()) {
    fmt::print("tokenizer: {}\n", tok.error().message);
    return;
  }
  const Vocab& v = tok.value()->vocab();
  auto name = [&](int32_t id) { return id >= 0 ? fmt::format("{} {:?}", id, v.tokens[id]) : std::string("none"); };
  std::string eog;
  for (int32_t id : v.end_of_generation) eog += (eog.empty() ? "" : ", ") + name(id);
  fmt::print("tokenizer: {}, {} tokens; BOS {}{}; generation ends at {}\n",
             v.kind == VocabKind::Spm ? "SentencePiece" : "byte-level BPE", v.size(), name(v.bos),
             v.add_bos ? " (added)" : "", eog.empty() ? std::string("nothing") : eog);
  auto tmpl = ChatTemplate::from_gguf(g, v);
  fmt::print("chat template: {}\n", tmpl.ok() ? tmpl->origin() : tmpl.error().message);
}

}  // namespace

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
    print_tokenizer_and_template(g);
    auto c = ModelConfig::from_gguf(g);
    if (!c.ok()) {
      fmt::print("model: {}\n", c.error().message);
      return 0;
    }
    fmt::print("model: {} layers, hidden {}, {} heads ({} KV heads, head dim {}), ffn {}, vocab {}, context {}\n",
               c->n_layer, c->n_embd, c->n_head, c->n_kv_head, c->head_dim, c->n_ff, c->n_vocab, c->n_ctx_train);
    fmt::print("architecture {}\n", c->spec.describe());
    if (const MoeSpec& moe = c->spec.moe; moe.active()) {
      const ParamCount p = count_params(g);
      fmt::print("parameters: {:.2f} B, of which {:.2f} B active per token ({} of {} experts: {} of {} read per decode token)\n",
                 p.total / 1e9, p.active(moe) / 1e9, moe.routing.n_used, moe.routing.n_expert,
                 human_bytes((uint64_t)p.active_bytes(moe)), human_bytes(p.total_bytes));
    }
    fmt::print("KV cache per token (f16): {} bytes; full context: {}\n",
               kv_cache_bytes(c->n_layer, c->n_kv_head, 1, c->head_dim, 2),
               human_bytes(kv_cache_bytes(c->n_layer, c->n_kv_head, c->n_ctx_train, c->head_dim, 2)));
    return 0;
  };
}

}  // namespace tandem::apps
