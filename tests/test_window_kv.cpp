// Window-only KV blocks (kv/layer_groups.h): a pool whose sliding-window layers keep only the
// blocks a later query reads must give the same logits, bit for bit, as the full store, on a
// random-weight Gemma-3-shaped model with a tiny window: prefill, decode, chunked prefill
// across the window's edge, speculative verify passes, prefix-cache hits, preemption and naive
// mode; and it must hold fewer blocks while doing so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "kv/layer_groups.h"
#include "model/model.h"
#include "tiny_model.h"

namespace tandem {
namespace {

constexpr int64_t kWindow = 6;
constexpr int kBlock = 4;

// Gemma 3's pattern: every 6th layer global, the rest windowed. 12 layers: 2 global, 10
// windowed, so a block holds 2 layers and there are 1 full and 5 window groups.
std::unique_ptr<Model> gemma_shaped() {
  test::TinyShape s;
  s.family = "gemma3";
  s.head_dim = 32;
  s.n_layer = 12;
  s.window = kWindow;
  s.n_ctx = 256;
  auto m = Model::from_gguf(test::tiny_model_file(s));
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::unique_ptr<BlockPool> pool(const Model& m, int64_t blocks, bool window_only) {
  auto p = BlockPool::create(m.kv_pool_shape(blocks, DType::F32, kBlock, window_only), m.backend());
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? std::move(p.value()) : nullptr;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(KvLayerGroups, GroupsOfEqualSizeAndTheFullStoreWhereNoneHelp) {
  std::vector<int64_t> gemma270m(18, 512);  // pattern 6: layers 5, 11, 17 global
  for (int l = 5; l < 18; l += 6) gemma270m[(size_t)l] = 0;
  const KvLayerGroups g = KvLayerGroups::plan(18, gemma270m);
  EXPECT_EQ(g.group_layers, 3);
  EXPECT_EQ(g.window, (std::vector<int64_t>{0, 512, 512, 512, 512, 512}));
  EXPECT_EQ(g.group_of[5], 0);
  EXPECT_EQ(g.slot_of[11], 1);
  EXPECT_EQ(g.group_of[0], 1);
  EXPECT_EQ(g.group_of[17], 0);
  // 8k context, 16-token blocks: 512 full blocks, 33 for each window group.
  EXPECT_EQ(g.blocks_per_sequence(8192, 16), 512 + 5 * 33);
  std::vector<int64_t> gemma1b(26, 512);  // 4 global, 22 windowed: 6 window groups of 4, 2 slots spare
  for (int l = 5; l < 26; l += 6) gemma1b[(size_t)l] = 0;
  const KvLayerGroups h = KvLayerGroups::plan(26, gemma1b);
  EXPECT_EQ(h.group_layers, 4);
  EXPECT_EQ(h.n_groups(), 7);
  EXPECT_EQ(h.n_window_groups(), 6);
  EXPECT_EQ(KvLayerGroups::plan(18, gemma270m, true).n_groups(), 1);             // --swa-full
  EXPECT_EQ(KvLayerGroups::plan(4, std::vector<int64_t>(4, 64)).n_groups(), 1);  // no global layer
  EXPECT_EQ(KvLayerGroups::plan(4, {}).group_layers, 4);
}

TEST(KvLayerGroups, BlocksBesideAreVerifiedByTheirAnchorAndGroup) {
  // A window group's block is found only under its group-0 block's prefix id and its own
  // group; never as a group-0 block (its parent id carries a tag no prefix id has).
  CpuBackend be;
  BlockPoolShape s{12, 2, 32, kBlock, 8, DType::F16, std::vector<int64_t>(12, kWindow)};
  s.layer_windows[5] = s.layer_windows[11] = 0;
  auto p = BlockPool::create(s, be);
  ASSERT_TRUE(p.ok()) << p.error().message;
  BlockPool& pool = *p.value();
  const std::vector<int32_t> toks = {1, 2, 3, 4};
  const int32_t a = pool.allocate(), b = pool.allocate();
  const uint64_t h = pool.chain_hash(0, toks), hb = pool.chain_hash(h, std::vector<int32_t>{1});
  pool.publish(a, -1, h, toks);
  const uint64_t anchor = pool.prefix_id(a);
  ASSERT_NE(anchor, 0u);
  pool.publish_beside(b, 1, anchor, hb, toks);
  pool.release(b);  // cached
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_FALSE(pool.cached_beside(2, anchor, hb, toks));       // another group
  EXPECT_FALSE(pool.cached_beside(1, anchor + 1, hb, toks));   // another prefix
  EXPECT_FALSE(pool.cached_beside(1, anchor, hb, std::vector<int32_t>{1, 2, 3, 5}));  // other tokens
  EXPECT_EQ(pool.lookup(a, hb, toks), -1);                     // not a group-0 block after a
  EXPECT_EQ(pool.lookup_beside(1, anchor, hb, toks), b);
  EXPECT_EQ(pool.ref_count(b), 1);
}

TEST(KvLayerGroups, BeyondTheWindowTheStoreHoldsOnlyItsBlocks) {
  // One sequence by hand, positions past the window: prefill in chunks that straddle the
  // window's edge, then decode, each window block returned once no query reads it. Every
  // logit equals the full store's, bit for bit.
  auto m = gemma_shaped();
  ASSERT_NE(m, nullptr);
  auto full = pool(*m, 64, false), win = pool(*m, 64, true);
  ASSERT_EQ(full->groups().n_groups(), 1);
  const KvLayerGroups& g = win->groups();
  ASSERT_EQ(g.n_groups(), 6);
  ASSERT_EQ(g.group_layers, 2);
  std::vector<int32_t> tokens;
  for (int t = 0; t < 40; t++) tokens.push_back((t * 13 + 5) % 90 + 3);
  std::vector<int32_t> full_table;
  std::vector<std::vector<int32_t>> tables((size_t)g.n_groups());
  int64_t n = 0;
  auto advance = [&](int64_t c) {
    for (int64_t k = (int64_t)full_table.size(); k * kBlock < n + c; k++) full_table.push_back(full->allocate());
    for (int gi = 0; gi < g.n_groups(); gi++) {
      auto& t = tables[(size_t)gi];
      const int64_t lo = g.first_kept(gi, n) / kBlock;
      for (int64_t k = 0; k < lo && k < (int64_t)t.size(); k++)
        if (t[(size_t)k] >= 0) win->release(t[(size_t)k]), t[(size_t)k] = -1;
      for (int64_t k = (int64_t)t.size(); k * kBlock < n + c; k++) t.push_back(k >= lo ? win->allocate() : -1);
    }
    const std::span<const int32_t> chunk(tokens.data() + n, (size_t)c);
    ForwardBatch a(kBlock), b(kBlock);
    ASSERT_TRUE(a.add_sequence(chunk, n, full_table, ForwardBatch::Logits::All).ok());
    ASSERT_TRUE(b.add_sequence(chunk, n, tables, ForwardBatch::Logits::All).ok());
    auto la = m->forward(*full, a);
    ASSERT_TRUE(la.ok()) << la.error().message;
    const std::vector<float> want(la->begin(), la->end());
    auto lb = m->forward(*win, b);
    ASSERT_TRUE(lb.ok()) << lb.error().message;
    EXPECT_TRUE(same_bits(want, *lb)) << "positions " << n << ".." << n + c - 1;
    n += c;
  };
  for (int64_t c : {5, 7, 3, 9}) advance(c);  // chunked prefill to 24, across the window's edges
  while (n < (int64_t)tokens.size()) advance(1);
  // Held now: every block of the full group; of each window group, the blocks of the last
  // query's window (positions 34..39: blocks 8 and 9).
  EXPECT_EQ(win->used_blocks(), 10 + 5 * 2);
  EXPECT_LT(win->used_blocks() * (int64_t)win->block_bytes(), full->used_blocks() * (int64_t)full->block_bytes());
  // A table missing a block the window still reads is refused, not read.
  tables[1][8] = -1;
  ForwardBatch bad(kBlock);
  ASSERT_TRUE(bad.add_sequence(std::span<const int32_t>(tokens.data(), 1), n - 1, tables, ForwardBatch::Logits::Last).ok());
  EXPECT_FALSE(m->forward(*win, bad).ok());
}

struct Events {
  std::map<int64_t, std::vector<SeqEvent>> by_id;
  SeqCallback callback() {
    return [this](const SeqEvent& e) {
      by_id[e.id].push_back(e);
      return true;
    };
  }
};

// Equal tokens and finishes; log-probabilities equal bit for bit, or within `tolerance`.
bool same_events(const std::vector<SeqEvent>& a, const std::vector<SeqEvent>& b, float tolerance = 0) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++) {
    if (a[i].token != b[i].token || a[i].finish != b[i].finish || a[i].n_generated != b[i].n_generated) return false;
    if (tolerance > 0) {
      if (std::fabs(a[i].logprob - b[i].logprob) > tolerance) return false;
      continue;
    }
    if (std::memcmp(&a[i].logprob, &b[i].logprob, sizeof(float)) != 0) return false;
    if (a[i].top_logprobs.size() != b[i].top_logprobs.size()) return false;
    for (size_t j = 0; j < a[i].top_logprobs.size(); j++)
      if (a[i].top_logprobs[j].first != b[i].top_logprobs[j].first ||
          std::memcmp(&a[i].top_logprobs[j].second, &b[i].top_logprobs[j].second, sizeof(float)) != 0)
        return false;
  }
  return true;
}

struct Served {
  std::vector<std::vector<SeqEvent>> events;  // per request, in order of submission
  SchedulerStats stats;
  int64_t peak_bytes = 0;  // the most KV bytes held at once
  int64_t used_after = 0;
};

// Two rounds of requests whose prompts (18 to 33 tokens) pass the window: the second round
// repeats the first's prompts, so it starts from the prefix cache. Sampled and greedy, with
// log-probabilities, lookup drafts on the repetitive ones.
Served serve(Model& m, BlockPool& p, SchedulerOptions o) {
  Served out;
  Scheduler sched(m, p, o);
  Events ev;
  std::vector<int64_t> ids;
  for (int round = 0; round < 2; round++) {
    for (int r = 0; r < 5; r++) {
      RequestParams rp;
      for (int t = 0; t < 18 + 4 * r; t++) rp.prompt.push_back(r % 2 ? (t % 5) + 10 : (r * 31 + t * 7) % 90 + 3);
      rp.max_tokens = r % 2 ? 40 : 14;
      rp.sampling.temperature = r == 3 ? 0.8f : 0.0f;
      rp.sampling.seed = 7 + r;
      rp.want_logprobs = true;
      rp.top_logprobs = 3;
      if (r % 2) {
        SpeculativeParams sp;
        sp.mode = SpeculativeMode::Lookup;
        rp.speculative = sp;
      }
      auto id = sched.add(rp, ev.callback());
      EXPECT_TRUE(id.ok());
      ids.push_back(id.ok() ? id.value() : -1);
      if (r == 1) (void)sched.step(), (void)sched.step();  // later requests join mid-generation
    }
    for (int k = 0; k < 10000 && sched.has_work(); k++) {
      EXPECT_TRUE(sched.step().ok());
      out.peak_bytes = std::max(out.peak_bytes, p.used_blocks() * (int64_t)p.block_bytes());
    }
  }
  for (int64_t id : ids) out.events.push_back(ev.by_id[id]);
  out.stats = sched.stats();
  out.used_after = p.used_blocks();
  return out;
}

void expect_same(const Served& a, const Served& b, const std::string& what, float tolerance = 0) {
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); i++) {
    EXPECT_GT(a.events[i].size(), 1u);
    EXPECT_TRUE(same_events(a.events[i], b.events[i], tolerance)) << what << ", request " << i;
  }
  EXPECT_EQ(b.used_after, 0) << what << ": every block back in the pool";
}

TEST(WindowKv, SchedulerEqualsTheFullStoreBitForBit) {
  auto m = gemma_shaped();
  ASSERT_NE(m, nullptr);
  SchedulerOptions o;
  o.max_batch_tokens = 7;  // prompts prefill in chunks that cross the window's edge
  auto full = pool(*m, 400, false), win = pool(*m, 400, true);
  const Served a = serve(*m, *full, o), b = serve(*m, *win, o);
  expect_same(a, b, "plenty of blocks");
  EXPECT_GT(b.stats.verify_steps, 0);           // speculative verify passes ran
  EXPECT_GT(b.stats.accepted_tokens, 0);
  EXPECT_GT(b.stats.cached_prompt_tokens, 0);   // and prefix-cache hits
  EXPECT_EQ(b.stats.cached_prompt_tokens, a.stats.cached_prompt_tokens);  // the window's blocks stayed cached
  EXPECT_LT(b.peak_bytes, a.peak_bytes * 2 / 3) << "window-only holds less";
  // Few blocks: sequences are preempted and recomputed, and the answers do not change. (The
  // schedules differ from the one above, so positions are computed in other passes: the CPU's
  // matmuls group tokens by pass, so the last bits of a logit may differ; the tokens may not.)
  auto small_full = pool(*m, 40, false), same_bytes_win = pool(*m, 40 * 12 / 2, true), small_win = pool(*m, 60, true);
  ASSERT_EQ(small_full->bytes(), same_bytes_win->bytes());
  const Served c = serve(*m, *small_full, o), d = serve(*m, *same_bytes_win, o), e = serve(*m, *small_win, o);
  expect_same(a, c, "full store, preempting", 1e-3f);
  expect_same(a, d, "window-only in the full store's bytes", 1e-3f);
  expect_same(a, e, "window-only, preempting", 1e-3f);
  EXPECT_GT(c.stats.preemptions, 0);
  EXPECT_LT(d.stats.preemptions, c.stats.preemptions);
  EXPECT_GT(e.stats.preemptions, 0);
  // Naive mode (no KV cache) recomputes every position each token, through the same groups.
  o.no_kv_cache = true;
  const Served f = serve(*m, *full, o), g = serve(*m, *win, o);
  for (size_t i = 0; i < f.events.size(); i++) EXPECT_TRUE(same_events(f.events[i], g.events[i])) << "naive, request " << i;
  EXPECT_EQ(g.used_after, 0);
}

TEST(WindowKv, ThePlannedSequencesFitTheirBlocks) {
  // Planned = allocated: a pool of as many blocks as KvLayerGroups plans for 3 sequences of 40
  // positions runs 3 at once without preempting any; the full store of the same bytes, one.
  auto m = gemma_shaped();
  ASSERT_NE(m, nullptr);
  const int64_t per_seq = pool(*m, 1, true)->groups().blocks_per_sequence(40, kBlock);
  EXPECT_EQ(per_seq, 10 + 5 * 3);
  auto win = pool(*m, 3 * per_seq, true), full = pool(*m, 3 * per_seq * 2 / 12, false);
  EXPECT_LE(full->bytes(), win->bytes());
  for (BlockPool* p : {win.get(), full.get()}) {
    SchedulerOptions o;
    o.max_batch_tokens = 4;
    Scheduler sched(*m, *p, o);
    Events ev;
    for (int r = 0; r < 3; r++) {
      RequestParams rp;
      for (int t = 0; t < 30; t++) rp.prompt.push_back((t * 7 + r * 5) % 90 + 3);
      rp.max_tokens = 10;
      ASSERT_TRUE(sched.add(rp, ev.callback()).ok());
    }
    size_t most = 0;
    for (int k = 0; k < 1000 && sched.has_work(); k++) {
      ASSERT_TRUE(sched.step().ok());
      most = std::max(most, sched.n_running());
    }
    EXPECT_EQ(most, p == win.get() ? 3u : 1u);
    EXPECT_EQ(sched.stats().preemptions, 0);
    for (auto& [id, events] : ev.by_id) EXPECT_EQ(events.back().n_generated, 10);
  }
}

TEST(WindowKv, APrefixHitNeedsTheWindowsBlocks) {
  // The window's blocks of a cached prefix are cached beside its full-attention blocks and
  // evicted on their own; a hit is cut back to the longest prefix whose window blocks are
  // all still cached.
  auto m = gemma_shaped();
  ASSERT_NE(m, nullptr);
  auto win = pool(*m, 200, true);
  std::vector<int32_t> prompt;
  for (int t = 0; t < 30; t++) prompt.push_back((t * 11) % 90 + 3);
  SchedulerOptions o;
  Scheduler sched(*m, *win, o);
  Events ev;
  std::map<std::vector<int32_t>, std::vector<int32_t>> answers;  // prompt -> its greedy tokens
  auto run = [&](const std::vector<int32_t>& p) {
    RequestParams rp;
    rp.prompt = p;
    rp.max_tokens = 3;
    auto id = sched.add(rp, ev.callback());
    EXPECT_TRUE(id.ok());
    for (int k = 0; k < 1000 && sched.has_work(); k++) EXPECT_TRUE(sched.step().ok());
    std::vector<int32_t> got;
    for (const SeqEvent& e : ev.by_id[id.value()])
      if (e.finish == FinishReason::None) got.push_back(e.token);
    if (!answers.count(p)) answers[p] = got;
    EXPECT_EQ(got, answers[p]) << "a prefix-cache hit changes nothing";
    return ev.by_id[id.value()].back().n_cached;
  };
  EXPECT_EQ(run(prompt), 0);
  EXPECT_EQ(run(prompt), 28);  // 7 whole blocks; the last token is computed for its logits
  // A prompt that shares 5 blocks (20 tokens) and then differs: a hit at 20 needs the window
  // groups' blocks of positions 15..19, which the first request computed and published.
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 20);
  for (int t = 0; t < 10; t++) other.push_back(80 + t);
  EXPECT_EQ(run(other), 20);
  // Eviction takes the least recently returned blocks first: the window blocks of the earliest
  // positions (returned as the sequence moved on). A hit needs the window's blocks before its
  // end, so once those are gone the hit is cut back, here to nothing, though group 0 still holds
  // the prefix; the answer does not change.
  for (int evicted : {1, 5}) {
    auto tight = pool(*m, 60, true);
    Scheduler small(*m, *tight, o);
    Events e2;
    auto run_small = [&](const std::vector<int32_t>& p) {
      RequestParams rp;
      rp.prompt = p;
      rp.max_tokens = 3;
      auto id = small.add(rp, e2.callback());
      EXPECT_TRUE(id.ok());
      for (int k = 0; k < 1000 && small.has_work(); k++) EXPECT_TRUE(small.step().ok());
      std::vector<int32_t> got;
      for (const SeqEvent& e : e2.by_id[id.value()])
        if (e.finish == FinishReason::None) got.push_back(e.token);
      EXPECT_EQ(got, answers[p]);
      return e2.by_id[id.value()].back().n_cached;
    };
    EXPECT_EQ(run_small(prompt), 0);
    std::vector<int32_t> taken;  // the free list, then `evicted` cached blocks, oldest first
    const int64_t free_list = tight->free_blocks() - tight->cached_blocks();
    for (int64_t i = 0; i < free_list + evicted; i++) taken.push_back(tight->allocate());
    for (int32_t b : taken) tight->release(b);
    // Shares 6 blocks (24 tokens): the window groups' blocks 4 and 5 (positions 19..23) are needed.
    std::vector<int32_t> shared(prompt.begin(), prompt.begin() + 24);
    for (int t = 0; t < 6; t++) shared.push_back(70 + t);
    if (!answers.count(shared)) {
      EXPECT_EQ(run(shared), 24);
    }
    EXPECT_EQ(run_small(shared), evicted == 1 ? 24 : 0) << evicted << " evicted";
  }
}

}  // namespace
}  // namespace tandem
