#include "apps/generation_options.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <cctype>
#include <cstdlib>
#include <random>

#include <fmt/core.h>

#include "apps/common.h"
#include "backend/make_backend.h"
#include "backend/mpi/mpi_collectives.h"
#include "core/timer.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/token_terminal.h"
#include "engine/draft_model.h"
#include "gguf/gguf_file.h"

namespace tandem::apps {

void ModelLoadOptions::add_to(CLI::App* sub) {
  sub->add_option("-m,--model", model, "GGUF model file")->required();
  sub->add_option("--device", device, "cpu | cuda | auto (the GPU when tandem was built with CUDA and one is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  sub->add_option("-t,--threads", threads, "threads (0 = all cores)")->check(CLI::Range(0, 1024));
  sub->add_option("--isa", isa, "kernel level: auto | avx512 | avx2 | scalar");
  sub->add_option("--activations", activations, "q8: 8-bit activations for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K/MXFP4 weights (fast, llama.cpp's numerics); f32: exact products")
      ->check(CLI::IsMember({"q8", "f32"}));
  sub->add_option("--exact-products", exact_products,
                  "with q8: comma-separated tensor name parts whose products keep f32 activations (e.g. output,ffn_down); "
                  "none: every product 8-bit; auto (default): the output head on models under 500M parameters whose head is at most a third of them");
  sub->add_option("--tensor-parallel", tensor_parallel,
                  "ranks to split the model over (by heads and rows, one per MPI process: mpirun -np N tandem ...); "
                  "0 (default): the MPI world's size")
      ->check(CLI::Range(0, 4096));
}

void add_kv_dtype_option(CLI::App* sub, std::string& dtype) {
  sub->add_option("--kv-dtype", dtype, "KV cache element type: f16, f32 or q8_0 (half of f16's bytes)")
      ->check(CLI::IsMember({"f16", "f32", "q8_0"}));
}

DType kv_dtype_of(const std::string& name) {
  return name == "f32" ? DType::F32 : name == "q8_0" ? DType::Q8_0 : DType::F16;
}

double kv_element_bytes(DType dtype) {
  const DTypeInfo info = *dtype_info((uint32_t)dtype);
  return (double)info.block_bytes / info.block_elems;
}

void SpeculativeOptions::add_to(CLI::App* sub, bool explain_width) {
  auto* o = sub->add_option("--speculative,--draft", mode,
                  "speculative decoding: off; lookup (draft the continuation of the longest recent n-gram that "
                  "recurs in the prompt and output); or draft (a smaller model of the same vocabulary, --draft-model, "
                  "proposes). The target verifies each draft in one pass; the output is unchanged. Default: draft "
                  "with --draft-model, else off");
  if (explain_width)
    o->description(o->get_description() + "; or a number K: model verify passes of 1 + K tokens beside plain decode")
        ->check(CLI::IsMember({"off", "lookup", "draft"}) | CLI::Range(1, 64), "off, lookup, draft or 1..64");
  else
    o->check(CLI::IsMember({"off", "lookup", "draft"}));
  sub->add_option("--draft-model,--model-draft", draft_model, "speculative decoding: the draft model (GGUF, the same vocabulary)");
  sub->add_option("--draft-max", draft_max, "speculative decoding: tokens drafted per step at most")->check(CLI::Range(1, 64));
  sub->add_option("--draft-p-min", draft_p_min,
                  "draft model: stop drafting once its most likely next token is less likely than this")
      ->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--lookup-ngram-min", ngram_min, "prompt lookup: shortest n-gram matched")->check(CLI::Range(1, 16));
  sub->add_option("--lookup-ngram-max", ngram_max, "prompt lookup: longest n-gram matched (tried first)")->check(CLI::Range(1, 16));
}

int SpeculativeOptions::width() const {
  if (!mode.empty() && std::isdigit((unsigned char)mode[0])) return std::atoi(mode.c_str());
  return enabled() ? draft_max : 0;
}

SpeculativeParams SpeculativeOptions::params() const {
  SpeculativeParams p;
  const bool numeric = !mode.empty() && std::isdigit((unsigned char)mode[0]);  // explain's K: runs plain
  const auto m = parse_speculative_mode(mode.empty() || numeric ? (draft_model.empty() || numeric ? "off" : "draft") : mode);
  p.mode = m.ok() ? m.value() : SpeculativeMode::Off;
  p.draft_max = draft_max;
  p.draft_p_min = draft_p_min;
  p.lookup.ngram_min = ngram_min;
  p.lookup.ngram_max = std::max(ngram_min, ngram_max);
  return p;
}

void ConstraintOptions::add_to(CLI::App* sub) {
  auto* schema = sub->add_option("--json-schema", json_schema_file,
                                 "constrain the output to JSON valid under this JSON Schema file (docs/grammars.md: the subset)");
  auto* gbnf = sub->add_option("--grammar", grammar_file, "constrain the output to this GBNF grammar file (root rule: root)");
  auto* json = sub->add_flag("--json", json_object, "constrain the output to a JSON object");
  schema->excludes(gbnf)->excludes(json);
  gbnf->excludes(json);
}

Status ConstraintOptions::apply(const Tokenizer& tok, GenerationConfig& cfg) const {
  if (!any()) return Status::Ok();
  const std::string& path = !json_schema_file.empty() ? json_schema_file : grammar_file;
  std::string text;
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error("cannot read {}", path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (json_object) {
    cfg.grammar = grammar::any_json_object_grammar();
  } else if (!json_schema_file.empty()) {
    const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) return make_error("{} is not JSON", path);
    auto g = grammar::grammar_from_json_schema(schema);
    if (!g.ok()) return make_error("{}: {}", path, g.error().message);
    cfg.grammar = g.value();
  } else {
    auto g = grammar::parse_gbnf(text);
    if (!g.ok()) return make_error("{}: {}", path, g.error().message);
    if (Status named = grammar::check_token_terminals(*g.value(), tok); !named.ok())
      return make_error("{}: {}", path, named.error().message);
    cfg.grammar = g.value();
  }
  cfg.masker = grammar::TokenMasker::for_tokenizer(tok, tok.vocab().end_of_generation);
  return Status::Ok();
}

Result<std::unique_ptr<Model>> SpeculativeOptions::load_draft(const ModelLoadOptions& load, const Model& target) const {
  if (draft_model.empty()) {
    if (params().mode == SpeculativeMode::Draft) return make_error("--speculative draft needs --draft-model FILE");
    return std::unique_ptr<Model>();
  }
  ModelLoadOptions o = load;
  o.model = draft_model;
  o.split_over_ranks = false;  // the draft runs whole on rank 0
  // The draft's precision never reaches the output (the target decides every token): its
  // products all take 8-bit activations, the fastest, whatever the target keeps exact.
  if (o.exact_products == "auto") o.exact_products = "none";
  auto lm = load_model(o);
  if (!lm.ok()) return make_error("--draft-model {}: {}", draft_model, lm.error().message);
  if (Status st = check_draft_vocabulary(target, *lm->model); !st.ok())
    return make_error("--draft-model {} cannot draft for {}: {}", draft_model, load.model, st.error().message);
  return std::move(lm->model);
}

void GenerationOptions::add_to(CLI::App* sub) {
  ModelLoadOptions::add_to(sub);
  sub->add_option("-n,--n-predict", n_predict, "maximum tokens to generate")->check(CLI::Range(0, 1 << 20));
  sub->add_option("--temp", temp, "temperature (0 = greedy)")->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-k", top_k, "top-k (0 = off)")->check(CLI::Range(0, 1 << 30));
  sub->add_option("--top-p", top_p, "top-p (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--min-p", min_p, "min-p (0 = off)")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--repeat-penalty", repeat_penalty, "penalty for recent tokens (1 = off)")->check(CLI::Range(0.0f, 10.0f));
  sub->add_option("--seed", seed, "RNG seed (-1 = random)");
  sub->add_flag("--no-kv-cache", no_kv_cache, "naive mode: recompute K,V of the whole sequence every step");
  sub->add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-generation tokens");
  add_kv_dtype_option(sub, kv_dtype);
  sub->add_flag("--no-stats", quiet_stats, "do not print the timing report");
  speculative.add_to(sub, speculative_width);
}

GenerationConfig GenerationOptions::config(const Vocab& vocab) const {
  GenerationConfig c;
  c.max_new_tokens = n_predict;
  c.use_kv_cache = !no_kv_cache;
  c.kv_dtype = kv_dtype_of(kv_dtype);
  c.stop_at_eog = !ignore_eos;
  c.stop_tokens = vocab.end_of_generation;
  c.sampling.temperature = temp;
  c.sampling.top_k = top_k;
  c.sampling.top_p = top_p;
  c.sampling.min_p = min_p;
  c.sampling.repeat_penalty = repeat_penalty;
  c.sampling.seed = seed >= 0 ? (uint64_t)seed : std::random_device{}();
  c.speculative = speculative.params();
  return c;
}

Result<LoadedModel> load_model(const ModelLoadOptions& o) {
  auto file = GgufFile::open(o.model);
  if (!file.ok()) return file.error();
  BackendChoice choice;
  choice.device = o.device;
  choice.threads = o.threads;
  choice.isa = o.isa;
  choice.quantized_activations = o.activations == "q8";
  choice.exact_products = exact_products_for(o.exact_products, *file.value());
  auto backend = make_backend(choice);
  if (!backend.ok()) return backend.error();
  ModelOptions mo;
  mo.backend = backend.value();
  std::shared_ptr<Collectives> world = o.split_over_ranks ? mpi_world() : nullptr;
  const int ranks = world ? world->size() : 1;
  if (o.split_over_ranks && o.tensor_parallel > 0 && o.tensor_parallel != ranks)
    return make_error("--tensor-parallel {}: this job has {} rank{}; start it as mpirun -np {} tandem ...{}",
                      o.tensor_parallel, ranks, ranks == 1 ? "" : "s", o.tensor_parallel,
                      mpi_built() ? "" : " (and build tandem with MPI: -DTANDEM_MPI=ON)");
  mo.tensor_parallel = world;
  const bool follower = world && world->rank() != 0;
  // A bar on a terminal's stderr once loading has taken a second (a 135M model loads in a
  // fraction); logs get none.
  Timer t;
  bool shown = false;
  const bool tty = isatty(STDERR_FILENO);
  mo.on_load_progress = [&](int done, int total) {
    if (follower || !tty || (!shown && t.seconds() < 1.0)) return;
    shown = true;
    const int width = 30, filled = width * done / total;
    fmt::print(stderr, "\rloading {} [{}{}] {}/{} layers, {:.1f} s", o.model, std::string((size_t)filled, '#'),
               std::string((size_t)(width - filled), '.'), done, total, t.seconds());
    if (done == total) fmt::print(stderr, "\n");
  };
  auto m = Model::from_gguf(std::move(file.value()), mo);
  if (!m.ok()) return m.error();
  if (follower) {  // ranks 1..N-1 run rank 0's passes until it is done, then leave
    const Status st = m.value()->follow();
    if (!st.ok()) fmt::print(stderr, "tandem rank {}: {}\n", world->rank(), st.error().message);
    std::exit(st.ok() ? 0 : 1);
  }
  auto tok = Tokenizer::from_gguf(m.value()->gguf());
  if (!tok.ok()) return tok.error();
  return LoadedModel{std::move(m.value()), std::move(tok.value())};
}

void print_stats(const GenerationStats& st, const Model& m, const GenerationOptions& o) {
  if (o.quiet_stats) return;
  const ModelConfig& c = m.config();
  fmt::print(stderr, "\n\n--- tandem: {} ({}), {} ---\n", c.name.empty() ? c.arch : c.name, c.arch,
             m.backend().describe());
  fmt::print(stderr, "prompt tokens  {}{}\n", st.n_prompt,
             st.n_reused ? fmt::format(" ({} reused from the KV cache)", st.n_reused) : "");
  fmt::print(stderr, "prefill        {} tokens in {:.2f} ms = {:.1f} tok/s   TTFT {:.2f} ms\n", st.n_prompt - st.n_reused,
             st.prefill_s * 1e3, st.prefill_tok_s(), st.ttft_s * 1e3);
  fmt::print(stderr, "decode         {} tokens in {:.2f} ms = {:.1f} tok/s   TPOT {:.2f} ms\n", st.n_decode_tokens,
             st.decode_s * 1e3, st.decode_tok_s(), st.tpot_s() * 1e3);
  if (o.speculative.enabled())
    fmt::print(stderr, "speculative    {}: {} drafted, {} accepted ({:.1f}%) in {} verify passes; {} decode passes, {:.2f} tokens each\n",
               speculative_mode_name(o.speculative.params().mode), st.n_drafted, st.n_accepted, 100.0 * st.acceptance_rate(), st.n_verify_steps,
               st.n_decode_steps, st.n_decode_steps ? (double)st.n_decode_tokens / st.n_decode_steps : 0.0);
  if (st.n_draft_passes || st.n_draft_prefill_passes)
    fmt::print(stderr, "draft model    {} passes in {:.2f} ms ({:.1f}% of decode); its prompt prefill {:.2f} ms (in TTFT)\n",
               st.n_draft_passes, st.draft_s * 1e3, st.decode_s > 0 ? 100.0 * st.draft_s / st.decode_s : 0.0,
               st.draft_prefill_s * 1e3);
  fmt::print(stderr, "generated      {} tokens{}\n", st.n_generated,
             st.stopped_by_eog ? " (stopped at end of generation)" : st.grammar_complete ? " (the grammar's sentence is complete)" : "");
  if (o.constrained)
    fmt::print(stderr, "constrained    {} full token masks; masks and matching took {:.2f} ms ({:.1f}% of decode)\n", st.n_masks,
               st.mask_s * 1e3, st.decode_s > 0 ? 100.0 * st.mask_s / st.decode_s : 0.0);
  if (o.no_kv_cache) {
    fmt::print(stderr, "KV cache       none kept: naive mode recomputed K,V of every earlier position at each step\n"
                       "               (in {} ({}) of scratch blocks)\n", st.kv_bytes, human_bytes(st.kv_bytes));
  } else {
    const DType dt = kv_dtype_of(o.kv_dtype);
    const DTypeInfo info = *dtype_info((uint32_t)dt);
    fmt::print(stderr, "KV cache       {} bytes ({}) = 2 x {} layers x {} kv heads x {} tokens x {} head dim x {} bytes ({}){}\n",
               st.kv_bytes, human_bytes(st.kv_bytes), c.n_layer, m.shard().n_kv_head, st.kv_tokens, c.head_dim,
               info.block_elems == 1 ? fmt::format("{}", info.block_bytes)
                                     : fmt::format("{}/{}", info.block_bytes, info.block_elems),
               info.name, m.shard().split() ? fmt::format(" on rank 0 of {} (no rank holds more heads)", m.shard().size) : "");
  }
  if (const Collectives* ranks = m.collectives()) {
    const CollectiveStats& cs = ranks->stats();
    const double passes_s = st.prefill_s + st.decode_s;
    const CommunicationCost k = communication_cost(c, m.shard(), 1, 0);
    fmt::print(stderr, "tensor parallel {} ranks ({}): {} collectives moved {} ({} per layer per token gathered by rank 0); "
               "{:.2f} ms in them, waits included ({:.1f}% of prefill + decode)\n",
               ranks->size(), ranks->describe(), cs.calls, human_bytes(cs.bytes), human_bytes((uint64_t)k.per_layer_bytes),
               cs.seconds * 1e3, passes_s > 0 ? 100 * cs.seconds / passes_s : 0.0);
  }
}

}  // namespace tandem::apps
