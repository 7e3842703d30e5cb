// The paged KV cache, the batched multi-sequence forward pass and the continuous-batching
// scheduler, on tiny in-memory models: every sequence served in a shared batch must produce
// exactly what it produces alone through the contiguous cache.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/generator.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "model/llama_model.h"
#include "tiny_model.h"

namespace tandem {
namespace {

std::unique_ptr<LlamaModel> tiny_model(DType wt = DType::Q8_0) {
  test::TinyShape s;
  s.weight_type = wt;
  s.n_ctx = 256;
  auto m = LlamaModel::from_gguf(test::tiny_model_file(s));
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::unique_ptr<BlockPool> pool_for(const LlamaModel& m, int64_t blocks, int block_tokens = 4) {
  BlockPoolShape s{m.config().n_layer, m.config().n_kv_head, m.config().head_dim, block_tokens, blocks, DType::F16};
  auto p = BlockPool::create(s);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? std::move(p.value()) : nullptr;
}

TEST(BlockPool, RefCountsPrefixCacheAndLruEviction) {
  BlockPoolShape s{2, 2, 8, 4, 3, DType::F16};
  auto p = BlockPool::create(s);
  ASSERT_TRUE(p.ok());
  BlockPool& pool = *p.value();
  EXPECT_EQ(pool.bytes(), 2ull * 2 * 2 * (4 * 3) * 8 * 2);  // the seed's formula for 12 tokens
  const int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  EXPECT_GE(a, 0);
  EXPECT_EQ(pool.allocate(), -1);  // all three in use
  EXPECT_EQ(pool.free_blocks(), 0);
  const std::vector<int32_t> toks = {1, 2, 3, 4};
  const uint64_t h = BlockPool::chain_hash(0, toks);
  EXPECT_NE(h, BlockPool::chain_hash(h, toks));  // same block, different prefix
  pool.publish(a, h);
  pool.release(a);  // cached, evictable
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_EQ(pool.lookup(h), a);  // a prefix hit brings it back into use
  EXPECT_EQ(pool.ref_count(a), 1);
  pool.retain(a);
  pool.release(a);
  EXPECT_EQ(pool.ref_count(a), 1);  // shared: still held once
  pool.release(a);
  pool.release(b);
  const int32_t d = pool.allocate();  // the plain free block goes first, the cached one stays
  EXPECT_EQ(d, b);
  const int32_t e = pool.allocate();  // now the cached prefix is evicted
  EXPECT_EQ(e, a);
  EXPECT_EQ(pool.lookup(h), -1);
  pool.release(c), pool.release(d), pool.release(e);
  EXPECT_EQ(pool.used_blocks(), 0);
}

TEST(ForwardBatch, EqualsEachSequenceAlone) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto pool = pool_for(*m, 32);
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 3, 88, 42, 42, 7}, {1, 60, 33}, {9, 9, 21, 4, 70, 11, 2, 8, 13, 50}};
  const int64_t V = m->config().n_vocab;
  // Alone: contiguous cache, prefill then one decode step.
  std::vector<std::vector<float>> alone_prefill, alone_decode;
  for (const auto& p : prompts) {
    auto kv = m->new_kv_cache(32, DType::F16);
    auto r = m->prefill(kv.value(), p);
    ASSERT_TRUE(r.ok());
    alone_prefill.emplace_back(r->begin(), r->end());
    auto d = m->decode(kv.value(), 77);
    alone_decode.emplace_back(d->begin(), d->end());
  }
  // Together: one batch with every prompt (logits at each last token), then one batch decoding all.
  std::vector<std::vector<int32_t>> tables(prompts.size());
  for (size_t s = 0; s < prompts.size(); s++)
    for (size_t k = 0; k < (prompts[s].size() + 1 + 3) / 4; k++) tables[s].push_back(pool->allocate());
  std::vector<BatchEntry> batch;
  for (size_t s = 0; s < prompts.size(); s++)
    for (size_t t = 0; t < prompts[s].size(); t++) batch.push_back({prompts[s][t], (int64_t)t, (int)s, t + 1 == prompts[s].size()});
  auto out = m->forward_batch(*pool, batch, tables);
  ASSERT_TRUE(out.ok()) << out.error().message;
  ASSERT_EQ(out->size(), prompts.size() * V);
  for (size_t s = 0; s < prompts.size(); s++)
    for (int64_t v = 0; v < V; v++) ASSERT_FLOAT_EQ((*out)[s * V + v], alone_prefill[s][v]) << "sequence " << s;
  std::vector<BatchEntry> step;
  for (size_t s = 0; s < prompts.size(); s++) step.push_back({77, (int64_t)prompts[s].size(), (int)s, true});
  auto dec = m->forward_batch(*pool, step, tables);
  ASSERT_TRUE(dec.ok());
  for (size_t s = 0; s < prompts.size(); s++)
    for (int64_t v = 0; v < V; v++) ASSERT_FLOAT_EQ((*dec)[s * V + v], alone_decode[s][v]) << "sequence " << s;
  // A position without a block is an error, not a stray write.
  std::vector<BatchEntry> bad = {{1, 40, 0, true}};
  EXPECT_FALSE(m->forward_batch(*pool, bad, tables).ok());
}

// Past one attention segment (256 keys), with a head size the SIMD attention kernels take (64):
// a 300-token prompt and a short one, prefilled and decoded together through the block pool,
// give exactly the logits each gives alone through its contiguous cache; and the decode step
// (its row's segments split over threads) equals prefilling that token with the prompt (the
// row's segments on one thread).
TEST(ForwardBatch, LongSequenceEqualsAloneAcrossAttentionSegments) {
  test::TinyShape shape;
  shape.n_embd = 128, shape.n_head = 2, shape.n_kv_head = 1, shape.n_ctx = 512, shape.weight_type = DType::Q8_0;
  auto loaded = LlamaModel::from_gguf(test::tiny_model_file(shape));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  LlamaModel& m = *loaded.value();
  ASSERT_EQ(m.config().head_dim, 64);
  std::vector<int32_t> long_prompt(300);
  for (size_t t = 0; t < long_prompt.size(); t++) long_prompt[t] = (int32_t)((t * 37 + 11) % 96);
  const std::vector<std::vector<int32_t>> prompts = {long_prompt, {4, 8, 15, 16, 23}};
  const int64_t V = m.config().n_vocab;
  std::vector<std::vector<float>> alone_prefill, alone_decode;
  for (const auto& p : prompts) {
    auto kv = m.new_kv_cache(320, DType::F16);
    auto r = m.prefill(kv.value(), p);
    ASSERT_TRUE(r.ok());
    alone_prefill.emplace_back(r->begin(), r->end());
    auto d = m.decode(kv.value(), 42);
    ASSERT_TRUE(d.ok());
    alone_decode.emplace_back(d->begin(), d->end());
  }
  std::vector<int32_t> with_next = long_prompt;
  with_next.push_back(42);
  auto kv = m.new_kv_cache(320, DType::F16);
  auto once = m.prefill(kv.value(), with_next);
  ASSERT_TRUE(once.ok());
  for (int64_t v = 0; v < V; v++) ASSERT_EQ((*once)[v], alone_decode[0][v]) << "decode step vs one prefill";
  auto pool = pool_for(m, 96, 16);
  std::vector<std::vector<int32_t>> tables(prompts.size());
  for (size_t s = 0; s < prompts.size(); s++)
    for (size_t k = 0; k < (prompts[s].size() + 1 + 15) / 16; k++) tables[s].push_back(pool->allocate());
  std::vector<BatchEntry> batch;
  for (size_t s = 0; s < prompts.size(); s++)
    for (size_t t = 0; t < prompts[s].size(); t++) batch.push_back({prompts[s][t], (int64_t)t, (int)s, t + 1 == prompts[s].size()});
  auto out = m.forward_batch(*pool, batch, tables);
  ASSERT_TRUE(out.ok()) << out.error().message;
  for (size_t s = 0; s < prompts.size(); s++)
    for (int64_t v = 0; v < V; v++) ASSERT_EQ((*out)[s * V + v], alone_prefill[s][v]) << "sequence " << s;
  std::vector<BatchEntry> step;
  for (size_t s = 0; s < prompts.size(); s++) step.push_back({42, (int64_t)prompts[s].size(), (int)s, true});
  auto dec = m.forward_batch(*pool, step, tables);
  ASSERT_TRUE(dec.ok());
  for (size_t s = 0; s < prompts.size(); s++)
    for (int64_t v = 0; v < V; v++) ASSERT_EQ((*dec)[s * V + v], alone_decode[s][v]) << "sequence " << s;
}

// Greedy continuation of a prompt, one sequence at a time through the contiguous cache.
std::vector<int32_t> greedy_alone(LlamaModel& m, const std::vector<int32_t>& prompt, int n) {
  GenerationConfig cfg;
  cfg.max_new_tokens = n;
  cfg.sampling.temperature = 0;
  cfg.stop_at_eog = false;
  std::vector<int32_t> out;
  Generator g(m);
  auto st = g.generate(prompt, cfg, [&](int32_t t) {
    out.push_back(t);
    return true;
  });
  EXPECT_TRUE(st.ok());
  return out;
}

struct Collected {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, SeqEvent> finished;
};

void run_all(Scheduler& s, int max_steps = 10000) {
  for (int k = 0; k < max_steps && s.has_work(); k++) ASSERT_TRUE(s.step().ok());
  ASSERT_FALSE(s.has_work());
}

TEST(Scheduler, ContinuousBatchingMatchesSequentialGreedy) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  for (int64_t blocks : {64, 9}) {  // plenty, and so few that sequences get preempted
    auto pool = pool_for(*m, blocks);
    SchedulerOptions o;
    o.max_batch_tokens = 16;  // prompts prefill in chunks
    Scheduler sched(*m, *pool, o);
    Collected c;
    std::vector<std::vector<int32_t>> prompts;
    std::map<int64_t, size_t> which;
    for (int r = 0; r < 6; r++) {
      std::vector<int32_t> p;
      for (int t = 0; t < 5 + 3 * r; t++) p.push_back((r * 31 + t * 7) % 90 + 3);
      prompts.push_back(p);
      RequestParams rp;
      rp.prompt = p;
      rp.max_tokens = 10;
      rp.sampling.temperature = 0;
      auto id = sched.add(rp, [&c](const SeqEvent& e) {
        if (e.finish != FinishReason::None) c.finished[e.id] = e;
        else c.tokens[e.id].push_back(e.token);
        return true;
      });
      ASSERT_TRUE(id.ok());
      which[id.value()] = (size_t)r;
      if (r == 2) {  // later requests join mid-generation
        ASSERT_TRUE(sched.step().ok());
        ASSERT_TRUE(sched.step().ok());
      }
    }
    run_all(sched);
    ASSERT_EQ(c.finished.size(), prompts.size());
    for (auto& [id, idx] : which) {
      EXPECT_EQ(c.tokens[id], greedy_alone(*m, prompts[idx], 10)) << "request " << idx << " with " << blocks << " blocks";
      EXPECT_EQ(c.finished[id].finish, FinishReason::Length);
    }
    EXPECT_EQ(pool->used_blocks(), 0) << "every block returns to the pool";
    if (blocks == 9) {
      EXPECT_GT(sched.stats().preemptions, 0);
    }
  }
}

TEST(Scheduler, PrefixCacheSkipsSharedPrefill) {
  auto m = tiny_model();
  auto pool = pool_for(*m, 64);
  Scheduler sched(*m, *pool);
  std::vector<int32_t> system;
  for (int t = 0; t < 20; t++) system.push_back(10 + t);
  Collected c;
  auto cb = [&c](const SeqEvent& e) {
    if (e.finish != FinishReason::None) c.finished[e.id] = e;
    else c.tokens[e.id].push_back(e.token);
    return true;
  };
  RequestParams a;
  a.prompt = system;
  a.prompt.push_back(50);
  a.max_tokens = 4;
  a.sampling.temperature = 0;
  auto ida = sched.add(a, cb);
  run_all(sched);
  RequestParams b = a;
  b.prompt.back() = 51;  // same "system prompt", different question
  auto idb = sched.add(b, cb);
  run_all(sched);
  EXPECT_EQ(c.finished[ida.value()].n_cached, 0);
  EXPECT_EQ(c.finished[idb.value()].n_cached, 20);  // 5 full blocks of 4
  EXPECT_EQ(c.tokens[idb.value()], greedy_alone(*m, b.prompt, 4));
  EXPECT_EQ(sched.stats().cached_prompt_tokens, 20);
  EXPECT_EQ(pool->used_blocks(), 0);
}

TEST(Scheduler, StopsCancelsAndRejects) {
  auto m = tiny_model();
  auto pool = pool_for(*m, 64);
  Scheduler sched(*m, *pool);
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23, 42};
  const auto ref = greedy_alone(*m, prompt, 6);
  Collected c;
  auto cb = [&c](const SeqEvent& e) {
    if (e.finish != FinishReason::None) c.finished[e.id] = e;
    else c.tokens[e.id].push_back(e.token);
    return true;
  };
  RequestParams stop;
  stop.prompt = prompt;
  stop.max_tokens = 6;
  stop.sampling.temperature = 0;
  stop.stop_tokens = {ref[2]};  // the third greedy token ends generation
  auto ids = sched.add(stop, cb);
  RequestParams cancel = stop;
  cancel.stop_tokens.clear();
  cancel.max_tokens = 50;
  int seen = 0;
  auto idc = sched.add(cancel, [&](const SeqEvent& e) {
    if (e.finish != FinishReason::None) c.finished[e.id] = e;
    return e.finish != FinishReason::None || ++seen < 3;  // the client leaves after 3 tokens
  });
  run_all(sched);
  EXPECT_EQ(c.tokens[ids.value()], std::vector<int32_t>(ref.begin(), ref.begin() + 2));
  EXPECT_EQ(c.finished[ids.value()].finish, FinishReason::Stop);
  EXPECT_EQ(c.finished[idc.value()].finish, FinishReason::Cancelled);
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(pool->used_blocks(), 0);
  RequestParams empty;
  EXPECT_FALSE(sched.add(empty, cb).ok());
  RequestParams huge;
  huge.prompt.assign(300, 5);  // past the tiny model's context of 256
  EXPECT_FALSE(sched.add(huge, cb).ok());
}

}  // namespace
}  // namespace tandem
