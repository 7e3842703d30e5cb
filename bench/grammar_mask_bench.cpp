// Token-mask micro-benchmarks (Google Benchmark): what constrained decoding adds to a decode
// step, on the bundled models' real vocabularies. Not tests: run
//   build/bench/tandem_grammar_bench [--benchmark_filter=SmolLM2]
// with the models in models/ (or $TANDEM_MODEL / $TANDEM_GEMMA_MODEL).
//   cold:   mask of a state never seen, nor its top (the whole trie walk, TokenMasker::compute)
//   shared: mask of a new state whose top was seen (a string at a new nesting, another
//           property's string): the shared walk's lookup plus the uncertain subtrees
//           (TokenMasker::compute_shared, what mask() does on a miss)
//   cached: mask of a recurring state (the LRU lookup, TokenMasker::mask)
//   allows: one token (the greedy fast path), on an uncached state
//   accept: advancing the matcher over a sampled token (once per decode step)
// A decode step of SmolLM2-135M takes ~4-5 ms on the CPU, so 10% is ~450 us.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/grammar/matcher.h"
#include "engine/grammar/token_mask.h"
#include "gguf/gguf_file.h"
#include "grammar_builder.h"
#include "tokenizer/tokenizer.h"

namespace tandem::grammar {
namespace {

struct Vocabulary {
  std::string name;
  std::unique_ptr<Tokenizer> tok;
  std::shared_ptr<const TokenMasker> masker;
};

std::unique_ptr<Vocabulary> load(const std::string& name, const std::string& path) {
  if (!std::filesystem::exists(path)) return nullptr;
  auto f = GgufFile::open(path);
  if (!f.ok()) return nullptr;
  auto tok = Tokenizer::from_gguf(*f.value());
  if (!tok.ok()) return nullptr;
  auto v = std::make_unique<Vocabulary>();
  v->name = name;
  v->tok = std::move(tok.value());
  v->masker = TokenMasker::for_tokenizer(*v->tok, v->tok->vocab().end_of_generation);
  return v;
}

std::string env_or(const char* var, const std::string& fallback) {
  const char* v = std::getenv(var);
  return v ? v : fallback;
}

// Where a JSON answer spends its tokens: inside strings, and at structural positions.
const std::vector<std::pair<std::string, std::string>> kStates = {
    {"start", ""},
    {"after_brace", "{"},
    {"key_colon", "{\"name\": "},
    {"in_string", "{\"name\": \"Al"},
    {"after_comma_nested", "{\"a\": {\"b\": [1, {\"c\": null}, "},
    {"in_number", "{\"age\": 4"},
    {"after_value", "{\"a\": true"},
};

Matcher matcher_after(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m = Matcher::create(g).value();
  if (!m.accept(text)) std::abort();
  return m;
}

void BM_MaskCold(benchmark::State& st, const Vocabulary* v, std::string text) {
  const Matcher m = matcher_after(test::json_object_grammar(), text);
  size_t allowed = 0;
  for (auto _ : st) {
    TokenMask mask = v->masker->compute(m);
    allowed = mask.count();
    benchmark::DoNotOptimize(mask.bits.data());
  }
  st.counters["allowed"] = (double)allowed;
}

void BM_MaskShared(benchmark::State& st, const Vocabulary* v, std::string text) {
  const Matcher m = matcher_after(test::json_object_grammar(), text);
  v->masker->compute_shared(m);  // the walk of the state's top, now cached
  for (auto _ : st) {
    TokenMask mask = v->masker->compute_shared(m);
    benchmark::DoNotOptimize(mask.bits.data());
  }
}

void BM_MaskCached(benchmark::State& st, const Vocabulary* v, std::string text) {
  const Matcher m = matcher_after(test::json_object_grammar(), text);
  v->masker->mask(m);
  for (auto _ : st) benchmark::DoNotOptimize(v->masker->mask(m));
}

void BM_Allows(benchmark::State& st, const Vocabulary* v, std::string text) {
  const Matcher m = matcher_after(test::json_object_grammar(), text);
  const int32_t t = v->tok->encode("abc", false, false).front();
  for (auto _ : st) benchmark::DoNotOptimize(v->masker->allows(m, t));
}

void BM_Accept(benchmark::State& st, const Vocabulary* v, std::string text) {
  const Matcher m = matcher_after(test::json_object_grammar(), text);
  for (auto _ : st) {
    Matcher copy = m;
    benchmark::DoNotOptimize(copy.accept("\"x\""));
  }
}

int register_all() {
  static std::vector<std::unique_ptr<Vocabulary>> vocabs;
  const std::string src = TANDEM_SOURCE_DIR;
  vocabs.push_back(load("SmolLM2", env_or("TANDEM_MODEL", src + "/models/SmolLM2-135M-Instruct.Q4_1.gguf")));
  vocabs.push_back(load("Gemma3", env_or("TANDEM_GEMMA_MODEL", src + "/models/gemma-3-270m-q4_k_m.gguf")));
  for (const auto& v : vocabs) {
    if (!v) continue;
    for (const auto& [state, text] : kStates) {
      const std::string at = "/" + v->name + "/" + state;
      benchmark::RegisterBenchmark(("mask_cold" + at).c_str(), BM_MaskCold, v.get(), text)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("mask_shared" + at).c_str(), BM_MaskShared, v.get(), text)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("mask_cached" + at).c_str(), BM_MaskCached, v.get(), text)->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("allows/" + v->name + "/in_string").c_str(), BM_Allows, v.get(), kStates[3].second)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("accept/" + v->name + "/key_colon").c_str(), BM_Accept, v.get(), kStates[2].second)
        ->Unit(benchmark::kMicrosecond);
  }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace tandem::grammar

BENCHMARK_MAIN();
