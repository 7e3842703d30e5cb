// Options shared by `run` and `chat`: model, sampling, threads, cache mode; and the
// end-of-run report of the two phases.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "core/error.h"
#include "engine/generator.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::apps {

// What loading a model takes: the file, threads, kernel level, activation precision. Every
// command that loads a model registers these flags the same way.
struct ModelLoadOptions {
  std::string model;
  std::string device = "auto";  // cpu | cuda | auto (the GPU when there is one)
  int threads = 0;
  std::string isa = "auto";
  std::string activations = "q8";
  // Tensor name parts whose products keep f32 activations under q8; "auto": the output head
  // (tied or not) on models small enough that its 8-bit rounding costs more than its speed.
  std::string exact_products = "auto";
  // --tensor-parallel N: the ranks the model is split over; 0: the MPI world's size (one rank
  // outside mpirun). A draft model is never split (it runs on rank 0 alone).
  int tensor_parallel = 0;
  bool split_over_ranks = true;
  void add_to(CLI::App* sub);
};

// --kv-dtype f16 | f32 | q8_0: the KV pool's element type, the same flag on every command.
// q8_0 halves f16's bytes (34 per 32 elements), so twice the tokens fit the same memory.
void add_kv_dtype_option(CLI::App* sub, std::string& dtype);
DType kv_dtype_of(const std::string& name);  // a name add_kv_dtype_option admitted
double kv_element_bytes(DType dtype);          // 2 for f16, 34/32 for q8_0

// --speculative lookup|draft, --draft-model, --draft-max, --draft-p-min, --lookup-ngram-min/max:
// speculative decoding by prompt lookup or by a draft model, the same flags on run, chat,
// explain and serve.
struct SpeculativeOptions {
  std::string mode;  // empty: draft when --draft-model is given, else off
  std::string draft_model;
  int draft_max = SpeculativeParams{}.draft_max;
  float draft_p_min = SpeculativeParams{}.draft_p_min;
  int ngram_min = LookupDraftParams{}.ngram_min, ngram_max = LookupDraftParams{}.ngram_max;
  // explain_width: --speculative also takes a number K (explain: model verify passes of 1 + K
  // tokens next to the plain decode it runs).
  void add_to(CLI::App* sub, bool explain_width = false);
  SpeculativeParams params() const;  // after CLI11 checked the names and ranges
  int width() const;  // K given as --speculative K; else draft_max when enabled; else 0
  bool enabled() const { return params().mode != SpeculativeMode::Off; }
  // The --draft-model, loaded like the target (`load`'s backend settings) and checked against
  // its vocabulary; null when none was given. An error for --speculative draft without one.
  Result<std::unique_ptr<Model>> load_draft(const ModelLoadOptions& load, const Model& target) const;
};

// --json-schema FILE | --grammar FILE | --json: constrained decoding for `run` (the output is
// a sentence of the grammar; docs/grammars.md).
struct ConstraintOptions {
  std::string json_schema_file, grammar_file;
  bool json_object = false;
  void add_to(CLI::App* sub);
  bool any() const { return !json_schema_file.empty() || !grammar_file.empty() || json_object; }
  // Reads and compiles the grammar into cfg (with the tokenizer's masker); nothing when unset.
  Status apply(const Tokenizer& tok, GenerationConfig& cfg) const;
};

struct GenerationOptions : ModelLoadOptions {
  int n_predict = 128;
  float temp = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int64_t seed = -1;
  bool no_kv_cache = false;
  bool ignore_eos = false;
  std::string kv_dtype = "f16";
  bool quiet_stats = false;
  SpeculativeOptions speculative;
  bool constrained = false;  // set by a command that applied a ConstraintOptions (for the report)
  bool speculative_width = false;  // set before add_to: --speculative also takes a number (explain)

  void add_to(CLI::App* sub);
  GenerationConfig config(const Vocab& vocab) const;
};

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
Result<LoadedModel> load_model(const ModelLoadOptions& o);

// Prints prompt tokens, TTFT, TPOT, tok/s of each phase and the KV pool's bytes to stderr.
void print_stats(const GenerationStats& st, const Model& m, const GenerationOptions& o);

}  // namespace tandem::apps
