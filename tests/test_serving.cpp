// The paged KV cache, the batched multi-sequence forward pass and the continuous-batching
// scheduler, on tiny in-memory models: every sequence served in a shared batch must produce
// exactly what it produces alone (its own pool, one sequence).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/generator.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "kv/siphash.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "test_sequence.h"
#include "tiny_model.h"

namespace tandem {
namespace {

std::unique_ptr<Model> tiny_model(DType wt = DType::Q8_0) {
  test::TinyShape s;
  s.weight_type = wt;
  s.n_ctx = 256;
  auto m = Model::from_gguf(test::tiny_model_file(s));
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

// The pools of the bookkeeping tests below hold their KV in host memory.
Backend& host() {
  static CpuBackend be;
  return be;
}

std::unique_ptr<BlockPool> pool_for(const Model& m, int64_t blocks, int block_tokens = 4) {
  BlockPoolShape s{m.config().n_layer, m.config().n_kv_head, m.config().head_dim, block_tokens, blocks, DType::F16};
  auto p = BlockPool::create(s, host());
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? std::move(p.value()) : nullptr;
}

TEST(BlockPool, RefCountsPrefixCacheAndLruEviction) {
  BlockPoolShape s{2, 2, 8, 4, 3, DType::F16};
  auto p = BlockPool::create(s, host());
  ASSERT_TRUE(p.ok());
  BlockPool& pool = *p.value();
  EXPECT_EQ(pool.bytes(), 2ull * 2 * 2 * (4 * 3) * 8 * 2);  // the seed's formula for 12 tokens
  const int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  EXPECT_TRUE(a >= 0 && b >= 0 && c >= 0);
  EXPECT_EQ(pool.allocate(), -1);  // all three in use
  EXPECT_EQ(pool.free_blocks(), 0);
  const std::vector<int32_t> toks = {1, 2, 3, 4};
  const uint64_t h = pool.chain_hash(0, toks);
  EXPECT_NE(h, pool.chain_hash(h, toks));  // same block, different prefix
  pool.publish(a, -1, h, toks);
  pool.release(a);  // cached, evictable
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_EQ(pool.lookup(-1, h, toks), a);  // a prefix hit brings it back into use
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
  EXPECT_EQ(pool.lookup(-1, h, toks), -1);
  pool.release(c), pool.release(d), pool.release(e);
  EXPECT_EQ(pool.used_blocks(), 0);
}

// SipHash-2-4's published test vector (key 00..0f, message 00..0e), and the pool's default
// hash is keyed: two pools hash the same block differently.
TEST(BlockPool, PrefixHashIsKeyedSipHash) {
  SipKey key{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  uint8_t msg[15];
  for (int i = 0; i < 15; i++) msg[i] = (uint8_t)i;
  EXPECT_EQ(siphash24(key, msg, 15), 0xa129ca6149be45e5ull);
  EXPECT_EQ(siphash24(key, msg, 0), 0x726fdb47dd0e0e31ull);
  BlockPoolShape s{1, 1, 4, 4, 2, DType::F16};
  auto p1 = BlockPool::create(s, host()), p2 = BlockPool::create(s, host());
  ASSERT_TRUE(p1.ok() && p2.ok());
  const std::vector<int32_t> toks = {7, 8, 9, 10};
  EXPECT_EQ(p1.value()->chain_hash(0, toks), p1.value()->chain_hash(0, toks));
  EXPECT_NE(p1.value()->chain_hash(0, toks), p2.value()->chain_hash(0, toks));
}

// A hash that depends on the block's first token only: every other difference collides.
uint64_t first_token_hash(uint64_t, std::span<const int32_t> tokens) { return 1000 + (uint64_t)tokens[0]; }

TEST(BlockPool, ForcedHashCollisionsAreMisses) {
  BlockPoolShape s{1, 1, 4, 4, 4, DType::F16};
  auto p = BlockPool::create(s, host(), first_token_hash);
  ASSERT_TRUE(p.ok());
  BlockPool& pool = *p.value();
  const std::vector<int32_t> x = {1, 2, 3, 4}, y = {5, 6, 7, 8}, x2 = {1, 9, 9, 9}, z = {2, 2, 2, 2};
  const int32_t a = pool.allocate(), b = pool.allocate();
  pool.publish(a, -1, pool.chain_hash(0, x), x);
  pool.publish(b, a, pool.chain_hash(0, y), y);  // [x][y]
  // Same hash, different tokens: a miss, not block a.
  EXPECT_EQ(pool.lookup(-1, pool.chain_hash(0, x2), x2), -1);
  EXPECT_EQ(pool.allocator().rejected_hits(), 1);
  // Same tokens and hash, different parent: [z][y] must not find [x][y].
  const int32_t c = pool.allocate();
  pool.publish(c, -1, pool.chain_hash(0, z), z);
  EXPECT_EQ(pool.lookup(c, pool.chain_hash(0, y), y), -1);
  EXPECT_EQ(pool.lookup(-1, pool.chain_hash(0, y), y), -1);  // nor at the start
  EXPECT_EQ(pool.allocator().rejected_hits(), 3);
  // The genuine chain still hits.
  const int32_t a1 = pool.lookup(-1, pool.chain_hash(0, x), x);
  ASSERT_EQ(a1, a);
  EXPECT_EQ(pool.lookup(a1, pool.chain_hash(0, y), y), b);
  pool.release(a), pool.release(a), pool.release(b), pool.release(b), pool.release(c);
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.cached_blocks(), 3);
  // Evict [x] (the oldest), then cache [x] anew in another block: its old child [x][y] was
  // computed after a prefix that no longer exists, so it is stale and must not be found.
  const int32_t f = pool.allocate(), g = pool.allocate();
  EXPECT_EQ(pool.lookup(-1, pool.chain_hash(0, x), x), -1);  // [x] was evicted
  pool.publish(f, -1, pool.chain_hash(0, x), x);
  EXPECT_EQ(pool.lookup(f, pool.chain_hash(0, y), y), -1);
  // Publishing the new [x][y] replaces the stale entry, and then it hits.
  pool.publish(g, f, pool.chain_hash(0, y), y);
  EXPECT_EQ(pool.lookup(f, pool.chain_hash(0, y), y), g);
  pool.release(g), pool.release(g), pool.release(f);
  // A child of a block that holds no verified prefix is neither published nor found.
  const int32_t u = pool.allocate(), v = pool.allocate();
  pool.publish(v, u, pool.chain_hash(0, z), z);
  EXPECT_EQ(pool.lookup(u, pool.chain_hash(0, z), z), -1);
  pool.release(u), pool.release(v);
  EXPECT_EQ(pool.used_blocks(), 0);
}

// Two sequences prefilling the same prefix at once: the second copy is not indexed, but it is
// verified, so the blocks published after it can still be found through the first copy.
TEST(BlockPool, DuplicatePrefixesShareTheirIdentity) {
  BlockPoolShape s{1, 1, 4, 4, 4, DType::F16};
  auto p = BlockPool::create(s, host());
  ASSERT_TRUE(p.ok());
  BlockPool& pool = *p.value();
  const std::vector<int32_t> x = {1, 2, 3, 4}, y = {5, 6, 7, 8};
  const uint64_t hx = pool.chain_hash(0, x), hy = pool.chain_hash(hx, y);
  const int32_t a = pool.allocate(), a2 = pool.allocate(), b2 = pool.allocate();
  pool.publish(a, -1, hx, x);
  pool.publish(a2, -1, hx, x);  // the duplicate
  pool.publish(b2, a2, hy, y);  // its child
  pool.release(a2);             // an unindexed duplicate goes straight back to the free list
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_EQ(pool.lookup(a, hy, y), b2);
  pool.release(a), pool.release(b2), pool.release(b2);
  EXPECT_EQ(pool.used_blocks(), 0);
}

TEST(ForwardBatch, EqualsEachSequenceAlone) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto pool = pool_for(*m, 32);
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 3, 88, 42, 42, 7}, {1, 60, 33}, {9, 9, 21, 4, 70, 11, 2, 8, 13, 50}};
  const int64_t V = m->config().n_vocab;
  // Alone: its own pool, prefill then one decode step.
  std::vector<std::vector<float>> alone_prefill, alone_decode;
  for (const auto& p : prompts) {
    test::OneSequence kv(*m, 32);
    auto r = kv.prefill(p);
    ASSERT_TRUE(r.ok());
    alone_prefill.emplace_back(r->begin(), r->end());
    auto d = kv.decode(77);
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
// a 300-token prompt and a short one, prefilled and decoded together through one block pool,
// give exactly the logits each gives alone in a pool of its own, whose single block holds the
// whole context (no table lookups inside it); and the decode step
// (its row's segments split over threads) equals prefilling that token with the prompt (the
// row's segments on one thread).
TEST(ForwardBatch, LongSequenceEqualsAloneAcrossAttentionSegments) {
  test::TinyShape shape;
  shape.n_embd = 128, shape.n_head = 2, shape.n_kv_head = 1, shape.n_ctx = 512, shape.weight_type = DType::Q8_0;
  auto loaded = Model::from_gguf(test::tiny_model_file(shape));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Model& m = *loaded.value();
  ASSERT_EQ(m.config().head_dim, 64);
  std::vector<int32_t> long_prompt(300);
  for (size_t t = 0; t < long_prompt.size(); t++) long_prompt[t] = (int32_t)((t * 37 + 11) % 96);
  const std::vector<std::vector<int32_t>> prompts = {long_prompt, {4, 8, 15, 16, 23}};
  const int64_t V = m.config().n_vocab;
  std::vector<std::vector<float>> alone_prefill, alone_decode;
  for (const auto& p : prompts) {
    test::OneSequence kv(m, 320, DType::F16, 512, 320);
    auto r = kv.prefill(p);
    ASSERT_TRUE(r.ok());
    alone_prefill.emplace_back(r->begin(), r->end());
    auto d = kv.decode(42);
    ASSERT_TRUE(d.ok());
    alone_decode.emplace_back(d->begin(), d->end());
  }
  std::vector<int32_t> with_next = long_prompt;
  with_next.push_back(42);
  test::OneSequence kv(m, 320, DType::F16, 512, 320);
  auto once = kv.prefill(with_next);
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

// Greedy continuation of a prompt, one request alone (Generator: a scheduler of one).
std::vector<int32_t> greedy_alone(Model& m, const std::vector<int32_t>& prompt, int n) {
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
  // A request's callback that records its tokens and its finish event here.
  SeqCallback callback() {
    return [this](const SeqEvent& e) {
      if (e.finish != FinishReason::None) finished[e.id] = e;
      else tokens[e.id].push_back(e.token);
      return true;
    };
  }
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
      auto id = sched.add(rp, c.callback());
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
  auto cb = c.callback();
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
  auto cb = c.callback();
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

// The prefix cache under a hash that collides whenever two blocks start with the same token:
// a request whose prompt collides with a cached one must compute its own KV (and answer as
// it answers alone), while a genuinely shared prefix is still reused.
TEST(Scheduler, PrefixCacheCollisionsDoNotShareKv) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  BlockPoolShape ps{m->config().n_layer, m->config().n_kv_head, m->config().head_dim, 4, 64, DType::F16};
  auto pool = BlockPool::create(ps, m->backend(), first_token_hash);
  ASSERT_TRUE(pool.ok());
  Scheduler sched(*m, *pool.value());
  Collected c;
  auto cb = c.callback();
  RequestParams a;
  for (int t = 0; t < 21; t++) a.prompt.push_back(10 + t);
  a.max_tokens = 6;
  a.sampling.temperature = 0;
  RequestParams b = a;  // every block starts with the same token as a's, nothing else equal
  for (size_t t = 0; t < b.prompt.size(); t++)
    if (t % 4 != 0) b.prompt[t] = 60 + (int32_t)t;
  RequestParams a2 = a;
  a2.prompt.back() = 77;
  auto ida = sched.add(a, cb);
  run_all(sched);
  auto ida2 = sched.add(a2, cb);
  run_all(sched);
  auto idb = sched.add(b, cb);
  run_all(sched);
  ASSERT_TRUE(ida.ok() && idb.ok() && ida2.ok());
  EXPECT_EQ(c.finished[idb.value()].n_cached, 0);
  EXPECT_EQ(c.tokens[idb.value()], greedy_alone(*m, b.prompt, 6));
  EXPECT_GT(pool.value()->allocator().rejected_hits(), 0);
  EXPECT_EQ(c.finished[ida2.value()].n_cached, 20);
  EXPECT_EQ(c.tokens[ida2.value()], greedy_alone(*m, a2.prompt, 6));
  EXPECT_EQ(pool.value()->used_blocks(), 0);
}

// A request cut short because the KV pool ran out (nothing left to preempt) ends as "length",
// having produced exactly what it produces alone up to that point.
TEST(Scheduler, KvExhaustionFinishesWithLength) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto pool = pool_for(*m, 3);  // 12 positions
  Scheduler sched(*m, *pool);
  Collected c;
  RequestParams r;
  r.prompt = {4, 8, 15, 16, 23};
  r.max_tokens = 50;
  r.sampling.temperature = 0;
  auto id = sched.add(r, c.callback());
  ASSERT_TRUE(id.ok());
  run_all(sched);
  const SeqEvent& fin = c.finished[id.value()];
  EXPECT_EQ(fin.finish, FinishReason::Length);
  EXPECT_STREQ(finish_reason_name(fin.finish), "length");
  // Positions 0..11 hold the prompt and 7 generated tokens; the 8th came from position 11's
  // logits and would need a 13th position.
  EXPECT_EQ(fin.n_generated, 8);
  EXPECT_EQ(c.tokens[id.value()], greedy_alone(*m, r.prompt, 8));
  EXPECT_EQ(pool->used_blocks(), 0);
}

// Many requests sharing a prefix on pools too small for any of them to finish: preemption,
// recomputation and prefix reuse interleave, and every request still ends, as "length", with
// the tokens it produces alone, and no block leaks. (A sequence preempted after outgrowing
// the pool must not wait forever to be readmitted.)
TEST(Scheduler, TinyPoolsEndEveryRequestAsLength) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  for (int64_t blocks : {3, 4, 5, 6, 8}) {
    auto pool = pool_for(*m, blocks);
    SchedulerOptions o;
    o.max_batch_tokens = 6;
    Scheduler sched(*m, *pool, o);
    Collected c;
    std::map<int64_t, std::vector<int32_t>> prompts;
    for (int r = 0; r < 4; r++) {
      RequestParams rp;
      rp.prompt = {4, 8, 15, 16, 23, 42, 7, 9};  // two shared blocks of 4
      for (int t = 0; t < r; t++) rp.prompt.push_back(50 + r + t);
      rp.max_tokens = 60;
      rp.sampling.temperature = 0;
      auto id = sched.add(rp, c.callback());
      ASSERT_TRUE(id.ok()) << id.error().message;
      prompts[id.value()] = rp.prompt;
    }
    run_all(sched);
    for (auto& [id, prompt] : prompts) {
      ASSERT_EQ(c.finished.count(id), 1u) << blocks << " blocks";
      const SeqEvent& fin = c.finished[id];
      EXPECT_EQ(fin.finish, FinishReason::Length) << blocks << " blocks";
      EXPECT_LE((int64_t)prompt.size() + fin.n_generated, blocks * 4 + 1) << blocks << " blocks";
      EXPECT_EQ(c.tokens[id], greedy_alone(*m, prompt, fin.n_generated)) << blocks << " blocks";
    }
    EXPECT_EQ(pool->used_blocks(), 0) << blocks << " blocks";
  }
}

// Preemption without thrashing (issue 34: 60 requests on a 1024-token pool counted 26,070
// preemptions in 4,186 steps): a sequence is admitted with blocks for all its tokens, and one
// readmitted after a preemption is not preempted again before it generates a token. Outputs
// stay each request's greedy tokens alone.
TEST(Scheduler, NoSequenceIsPreemptedAgainBeforeItProgresses) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto pool = pool_for(*m, 24);  // 96 positions for 12 requests of up to 8 + 24 tokens
  SchedulerOptions o;
  o.max_batch_tokens = 16;
  Scheduler sched(*m, *pool, o);
  Collected c;
  std::map<int64_t, std::vector<int32_t>> prompts;
  for (int r = 0; r < 12; r++) {
    RequestParams rp;
    for (int t = 0; t < 5 + r % 4; t++) rp.prompt.push_back((r * 13 + t * 5) % 90 + 3);
    rp.max_tokens = 24;
    rp.sampling.temperature = 0;
    auto id = sched.add(rp, c.callback());
    ASSERT_TRUE(id.ok());
    prompts[id.value()] = rp.prompt;
  }
  run_all(sched);
  int64_t total = 0;
  for (auto& [id, prompt] : prompts) {
    ASSERT_EQ(c.finished.count(id), 1u);
    const SeqEvent& fin = c.finished[id];
    EXPECT_EQ(c.tokens[id], greedy_alone(*m, prompt, fin.n_generated));
    EXPECT_LE(fin.n_preemptions, fin.n_generated + 1) << "request " << id << " was preempted without progress";
    total += fin.n_preemptions;
  }
  EXPECT_GT(total, 0) << "the pool is small enough to preempt";
  EXPECT_EQ(total, sched.stats().preemptions) << "the counter counts the preemptions that lost K,V";
  EXPECT_LT(sched.stats().preemptions, sched.stats().steps / 2);
  EXPECT_EQ(pool->used_blocks(), 0);
}

// A greedy request of `tenant`: n prompt tokens (first + t * step) % 90 + 3.
RequestParams tenant_request(const std::string& tenant, int n, int first, int step, int max_tokens) {
  RequestParams rp;
  for (int t = 0; t < n; t++) rp.prompt.push_back((first + t * step) % 90 + 3);
  rp.max_tokens = max_tokens;
  rp.sampling.temperature = 0;
  rp.tenant = tenant;
  return rp;
}

// Issue 45: one tenant's flood of long prompts pushed another tenant's first token from 15 ms
// to 8.3 s (admission first come first served, prefill chunks oldest first). Now the prefill
// budget is shared between tenants and admission and preemption favour the least served: B's
// one request gets its first token within a few steps while A's 8 prompts are still
// prefilling, its tokens equal greedy alone, and with every slot taken by A, B still gets one.
TEST(Scheduler, TenantsShareAdmissionAndPrefill) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  for (int max_running : {64, 4}) {
    auto pool = pool_for(*m, 128);
    SchedulerOptions o;
    o.max_batch_tokens = 16;
    o.max_running = max_running;
    Scheduler sched(*m, *pool, o);
    Collected c;
    for (int r = 0; r < 8; r++)  // tenant A: 8 prompts of 60 tokens = 30 steps of prefill alone
      ASSERT_TRUE(sched.add(tenant_request("A", 60, r * 17, 3, 8), c.callback()).ok());
    ASSERT_TRUE(sched.step().ok());  // A is under way
    const RequestParams b = tenant_request("B", 12, 0, 11, 4);
    auto bid = sched.add(b, c.callback());
    ASSERT_TRUE(bid.ok());
    int steps = 0;
    while (c.tokens[bid.value()].empty() && steps < 200) {
      ASSERT_TRUE(sched.step().ok());
      steps++;
    }
    // Half of each step's 16 tokens: 12 prompt tokens in 2 steps (3 with a preemption first).
    EXPECT_LE(steps, 3) << "max_running " << max_running;
    run_all(sched);
    EXPECT_EQ(c.tokens[bid.value()], greedy_alone(*m, b.prompt, 4));
    EXPECT_EQ(c.finished.size(), 9u);
    EXPECT_EQ(pool->used_blocks(), 0);
  }
}

// The other half of issue 45's probe: A's streams are decoding and hold every KV block. B's
// request takes blocks from A (its newest stream is preempted) and its prompt is prefilled in
// a step of its own, so its first token comes after one short pass; A's tokens stay greedy.
TEST(Scheduler, ATenantWithNothingRunningGetsBlocksAndAStep) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto pool = pool_for(*m, 16);  // 64 positions: A's 4 streams of 4 + 12 tokens fill them
  SchedulerOptions o;
  o.max_batch_tokens = 32;
  Scheduler sched(*m, *pool, o);
  Collected c;
  std::map<int64_t, std::vector<int32_t>> prompts;
  for (int r = 0; r < 4; r++) {
    const RequestParams rp = tenant_request("A", 4, r * 19, 7, 12);
    auto id = sched.add(rp, c.callback());
    ASSERT_TRUE(id.ok());
    prompts[id.value()] = rp.prompt;
  }
  for (int k = 0; k < 12 && pool->free_blocks() > 0; k++) ASSERT_TRUE(sched.step().ok());  // A decoding
  ASSERT_EQ(pool->free_blocks(), 0);
  ASSERT_EQ(sched.n_running(), 4u);
  const RequestParams b = tenant_request("B", 10, 0, 23, 3);
  auto bid = sched.add(b, c.callback());
  ASSERT_TRUE(bid.ok());
  ASSERT_TRUE(sched.step().ok());
  EXPECT_EQ(c.tokens[bid.value()].size(), 1u) << "B's first token comes from the next step";
  run_all(sched);
  EXPECT_EQ(c.tokens[bid.value()], greedy_alone(*m, b.prompt, 3));
  for (auto& [id, prompt] : prompts) EXPECT_EQ(c.tokens[id], greedy_alone(*m, prompt, 12));
  EXPECT_GT(sched.stats().preemptions, 0);
  EXPECT_EQ(pool->used_blocks(), 0);
}

// Cache scopes: a block published in one scope is never a hit in another (nor in the shared
// scope), so neither the KV nor the cached-token count crosses tenants.
TEST(BlockPool, PrefixCacheScopesDoNotShare) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto pool = pool_for(*m, 8);
  const std::vector<int32_t> toks = {1, 2, 3, 4};
  const uint64_t a = pool->scope_root("tenant-a"), b = pool->scope_root("tenant-b");
  EXPECT_EQ(pool->scope_root(""), 0u);
  EXPECT_NE(a, b);
  EXPECT_NE(a, 0u);
  const int32_t blk = pool->allocate();
  pool->publish(blk, -1, pool->chain_hash(a, toks), toks, a);
  pool->release(blk);
  EXPECT_EQ(pool->lookup(-1, pool->chain_hash(b, toks), toks, b), -1);
  EXPECT_EQ(pool->lookup(-1, pool->chain_hash(0, toks), toks, 0), -1);
  EXPECT_EQ(pool->lookup(-1, pool->chain_hash(a, toks), toks, b), -1) << "the root is checked, not only the hash";
  EXPECT_EQ(pool->lookup(-1, pool->chain_hash(a, toks), toks, a), blk);
  pool->release(blk);

  // Through the scheduler: the same prompt in another scope prefills in full.
  Scheduler sched(*m, *pool);
  Collected c;
  RequestParams rp;
  rp.prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  rp.max_tokens = 1;
  rp.sampling.temperature = 0;
  std::vector<int64_t> ids;
  for (const char* scope : {"x", "y", "x", ""}) {
    rp.cache_scope = scope;
    auto id = sched.add(rp, c.callback());
    ASSERT_TRUE(id.ok());
    ids.push_back(id.value());
    run_all(sched);
  }
  EXPECT_EQ(c.finished[ids[0]].n_cached, 0);
  EXPECT_EQ(c.finished[ids[1]].n_cached, 0) << "scope y does not see scope x's blocks";
  EXPECT_EQ(c.finished[ids[2]].n_cached, 8) << "scope x finds its own";
  EXPECT_EQ(c.finished[ids[3]].n_cached, 0);
}

// top_logprobs: the N most likely tokens with their log-softmax values, most likely first; the
// greedy choice is the first, and the values are those of a softmax over the model's logits.
TEST(Scheduler, TopLogprobsAreTheMostLikelyTokens) {
  auto m = tiny_model(DType::F32);
  ASSERT_NE(m, nullptr);
  auto pool = pool_for(*m, 16);
  Scheduler sched(*m, *pool);
  std::vector<SeqEvent> events;
  RequestParams r;
  r.prompt = {4, 8, 15, 16, 23, 42};
  r.max_tokens = 3;
  r.sampling.temperature = 0;
  r.want_logprobs = true;
  r.top_logprobs = 5;
  ASSERT_TRUE(sched.add(r, [&](const SeqEvent& e) {
                 if (e.finish == FinishReason::None) events.push_back(e);
                 return true;
               }).ok());
  RequestParams plain = r;  // no logprobs asked: no alternatives sent
  plain.want_logprobs = false;
  plain.top_logprobs = 0;
  bool plain_has_top = false;
  ASSERT_TRUE(sched.add(plain, [&](const SeqEvent& e) {
                 plain_has_top |= !e.top_logprobs.empty();
                 return true;
               }).ok());
  run_all(sched);
  EXPECT_FALSE(plain_has_top);
  ASSERT_EQ(events.size(), 3u);
  // The reference: logits of the same prefix computed afresh, softmax here.
  std::vector<int32_t> seen = r.prompt;
  for (const SeqEvent& e : events) {
    const std::vector<float> row = test::no_cache_logits(*m, seen);
    const size_t V = (size_t)m->config().n_vocab;
    ASSERT_EQ(row.size(), V);  // the last position's
    double mx = *std::max_element(row.begin(), row.end()), sum = 0;
    for (float x : row) sum += std::exp((double)x - mx);
    std::vector<std::pair<double, int32_t>> ref;
    for (size_t i = 0; i < V; i++) ref.push_back({(double)row[i] - mx - std::log(sum), (int32_t)i});
    std::sort(ref.begin(), ref.end(), [](auto& a, auto& b) { return a.first > b.first; });
    ASSERT_EQ(e.top_logprobs.size(), 5u);
    EXPECT_EQ(e.top_logprobs[0].first, e.token);
    EXPECT_FLOAT_EQ(e.top_logprobs[0].second, e.logprob);
    for (size_t k = 0; k < 5; k++) {
      EXPECT_EQ(e.top_logprobs[k].first, ref[k].second) << "rank " << k;
      EXPECT_NEAR(e.top_logprobs[k].second, ref[k].first, 2e-3) << "rank " << k;
      EXPECT_LT(e.top_logprobs[k].second, 0.0f);
      if (k) {
        EXPECT_GE(e.top_logprobs[k - 1].second, e.top_logprobs[k].second);
      }
    }
    seen.push_back(e.token);
  }
}

}  // namespace
}  // namespace tandem
