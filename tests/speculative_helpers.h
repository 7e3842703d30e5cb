// Helpers of the speculative-decoding tests (test_speculative.cpp: lookup drafts and the
// verify pass; test_speculative_draft_model.cpp: the draft model): tiny models, generation
// through the Generator and the scheduler, and a two-sample chi-square test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "engine/generator.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "kv/block_pool.h"
#include "model/model.h"
#include "tiny_model.h"

namespace tandem::spec_test {

using Tokens = std::vector<int32_t>;

// Two-sample chi-square statistic over the bins of two equally sized samples, bins with fewer
// than 10 counts in all pooled; and the df's critical value at p = 1e-4 (Wilson-Hilferty).
struct ChiSquare {
  double stat = 0;
  int df = 0;
  double critical() const {
    const double z = 3.719, k = df;
    return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
  }
};
inline ChiSquare chi_square(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
  std::map<int32_t, std::pair<int, int>> bins;
  for (auto& [k, n] : a) bins[k].first += n;
  for (auto& [k, n] : b) bins[k].second += n;
  ChiSquare c;
  int pa = 0, pb = 0, nbins = 0;
  auto add = [&](int x, int y) {
    if (x + y == 0) return;
    c.stat += (double)(x - y) * (x - y) / (x + y);
    nbins++;
  };
  for (auto& [k, n] : bins) {
    if (n.first + n.second < 10) pa += n.first, pb += n.second;
    else add(n.first, n.second);
  }
  add(pa, pb);
  c.df = std::max(1, nbins - 1);
  return c;
}

inline std::unique_ptr<Model> tiny_model(DType wt = DType::Q8_0, uint32_t seed = 42) {
  test::TinyShape s;
  s.weight_type = wt;
  s.n_ctx = 256;
  auto m = Model::from_gguf(test::tiny_model_file(s, seed));
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

inline SpeculativeParams lookup(int draft_max = 8, int ngram_min = 1) {
  SpeculativeParams p;
  p.mode = SpeculativeMode::Lookup;
  p.draft_max = draft_max;
  p.lookup.ngram_min = ngram_min;
  return p;
}

struct Generated {
  Tokens tokens;
  GenerationStats stats;
};

inline Generated generate(Model& m, const Tokens& prompt, int n, const SpeculativeParams& spec, float temp = 0,
                   uint64_t seed = 0, Tokens stop = {}, Model* draft_model = nullptr) {
  GenerationConfig cfg;
  cfg.max_new_tokens = n;
  cfg.sampling.temperature = temp;
  cfg.sampling.seed = seed;
  cfg.stop_tokens = std::move(stop);
  cfg.stop_at_eog = !cfg.stop_tokens.empty();
  cfg.speculative = spec;
  cfg.draft_model = draft_model;
  Generated g;
  Generator gen(m);
  auto st = gen.generate(prompt, cfg, [&](int32_t t) {
    g.tokens.push_back(t);
    return true;
  });
  EXPECT_TRUE(st.ok()) << st.error().message;
  if (st.ok()) g.stats = st.value();
  return g;
}

// A prompt that repeats a phrase, so lookup has something to propose.
inline Tokens repetitive_prompt(int variant) {
  Tokens phrase;
  for (int t = 0; t < 7; t++) phrase.push_back((variant * 13 + t * 11) % 90 + 3);
  Tokens p;
  for (int r = 0; r < 4; r++) p.insert(p.end(), phrase.begin(), phrase.end());
  p.insert(p.end(), phrase.begin(), phrase.begin() + 3);
  return p;
}

inline std::unique_ptr<BlockPool> pool_for(Model& m, int64_t blocks, int block_tokens = 4) {
  auto p = m.new_kv_pool(blocks, DType::F16, block_tokens);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? std::move(p.value()) : nullptr;
}

struct Collected {
  std::map<int64_t, Tokens> tokens;
  std::map<int64_t, SeqEvent> finished;
  std::map<int64_t, std::vector<float>> logprobs;
  SeqCallback callback() {
    return [this](const SeqEvent& e) {
      if (e.finish != FinishReason::None) {
        finished[e.id] = e;
      } else {
        tokens[e.id].push_back(e.token);
        logprobs[e.id].push_back(e.logprob);
      }
      return true;
    };
  }
};

inline void run_all(Scheduler& s) {
  for (int k = 0; k < 20000 && s.has_work(); k++) ASSERT_TRUE(s.step().ok());
  ASSERT_FALSE(s.has_work());
}

}  // namespace tandem::spec_test
