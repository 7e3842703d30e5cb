// What a verify pass costs: the time of one forward pass of n tokens (1..N) at a context depth,
// with logits for every row (as speculative decoding's verify passes ask), against a
// one-token decode pass. Speculative decoding pays when a pass of 1+k tokens costs much less
// than 1+k decode passes; this prints that ratio per n.
//
//   build/bench/tandem_pass_bench MODEL.gguf [--threads 2] [--depth 256] [--max 9] [--reps 40]
//                                 [--exact auto | output,token_embd | none] [--only N]
//
// The sizes alternate within each repetition (n = 1, 2, ..., N, then again), so a machine that
// slows down mid-run slows every size alike. Prints the median ms per pass and its ratio to n=1.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/make_backend.h"
#include "engine/sequence_runner.h"
#include "model/model.h"

using namespace tandem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [--threads T] [--depth D] [--max N] [--reps R] [--exact auto|LIST|none] [--only N]\n",
                 argv[0]);
    return 2;
  }
  BackendChoice choice;
  choice.device = "cpu";
  choice.threads = 2;
  std::string exact = "auto";  // as tandem's --exact-products
  int64_t depth = 256;
  int max_n = 9, reps = 40, only = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--threads") choice.threads = std::atoi(value.c_str());
    else if (flag == "--depth") depth = std::atoll(value.c_str());
    else if (flag == "--max") max_n = std::atoi(value.c_str());
    else if (flag == "--reps") reps = std::atoi(value.c_str());
    else if (flag == "--only") only = max_n = std::atoi(value.c_str());  // one size alone (for a profiler)
    else if (flag == "--exact") exact = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  auto file = GgufFile::open(argv[1]);
  if (!file) return std::fprintf(stderr, "%s\n", file.error().message.c_str()), 1;
  choice.exact_products = exact_products_for(exact, **file);
  auto backend = make_backend(choice);
  if (!backend) return std::fprintf(stderr, "%s\n", backend.error().message.c_str()), 1;
  ModelOptions opts;
  opts.backend = *backend;
  auto model = Model::load(argv[1], opts);
  if (!model) return std::fprintf(stderr, "%s\n", model.error().message.c_str()), 1;
  const int64_t block = 16, blocks = (depth + max_n + block - 1) / block + 2;
  auto pool = (*model)->new_kv_pool(blocks, DType::F16, (int)block);
  if (!pool) return std::fprintf(stderr, "%s\n", pool.error().message.c_str()), 1;
  SequenceRunner runner(**model, **pool);
  const int32_t n_vocab = (int32_t)(*model)->config().n_vocab;
  std::vector<int32_t> prompt((size_t)depth);
  for (int64_t i = 0; i < depth; i++) prompt[(size_t)i] = (int32_t)((i * 7919 + 13) % n_vocab);
  if (depth > 0 && !runner.run(prompt)) return std::fprintf(stderr, "prefill failed\n"), 1;
  std::vector<std::vector<double>> ms((size_t)max_n + 1);
  std::vector<int32_t> tokens((size_t)max_n);
  for (int i = 0; i < max_n; i++) tokens[(size_t)i] = (int32_t)((i * 104729 + 5) % n_vocab);
  for (int r = -2; r < reps; r++)  // two warm-up rounds
    for (int n = only > 0 ? only : 1; n <= max_n; n++) {
      const auto t0 = std::chrono::steady_clock::now();
      auto out = runner.run(std::span<const int32_t>(tokens.data(), (size_t)n), true);
      const auto t1 = std::chrono::steady_clock::now();
      if (!out) return std::fprintf(stderr, "pass failed: %s\n", out.error().message.c_str()), 1;
      runner.truncate(depth);
      if (r >= 0) ms[(size_t)n].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  std::printf("%s\n%s, depth %lld, %d reps, logits for every row\n", argv[1], (*model)->backend().describe().c_str(),
              (long long)depth, reps);
  std::printf("%4s %10s %12s %12s\n", "n", "ms/pass", "x one-token", "ms/token");
  double one = 0;
  for (int n = only > 0 ? only : 1; n <= max_n; n++) {
    auto& v = ms[(size_t)n];
    std::sort(v.begin(), v.end());
    const double med = v[v.size() / 2];
    if (n == 1) one = med;
    std::printf("%4d %10.3f %12.2f %12.3f\n", n, med, med / one, med / n);
  }
  return 0;
}
