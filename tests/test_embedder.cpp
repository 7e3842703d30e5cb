// EmbeddingJob (engine/embedder.h): a job runs one pass of at most the token budget per step,
// so the serving loop can interleave it with the scheduler's steps; the vectors do not depend
// on how the inputs were cut into passes; a full pool is NoRoom (nothing run, nothing lost)
// until blocks come back; a generation-only model and an empty input are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/embedder.h"
#include "kv/block_table.h"
#include "model/model.h"
#include "tiny_model.h"

namespace tandem {
namespace {

std::unique_ptr<Model> embedding_model(int pooling) {
  test::TinyShape s;
  s.n_ctx = 256;
  s.pooling = pooling;
  auto m = Model::from_gguf(test::tiny_model_file(s));
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::vector<std::vector<int32_t>> inputs() {
  std::vector<std::vector<int32_t>> in;
  for (int n : {5, 40, 1, 23}) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; i++) t.push_back((i * 7 + n) % 90 + 3);
    in.push_back(t);
  }
  return in;
}

// A job's vectors, its passes back to back (a full pool: an error).
Result<std::vector<std::vector<float>>> run_job(Model& model, BlockPool& pool, int64_t max_batch_tokens) {
  auto job = EmbeddingJob::start(model, pool, inputs());
  if (!job.ok()) return job.error();
  while (!job->finished()) {
    auto s = job->step(max_batch_tokens);
    if (!s.ok()) return s.error();
    if (s.value() == EmbeddingJob::Step::NoRoom) return make_error("no room");
  }
  return job->vectors();
}

TEST(Embedder, AJobRunsOnePassPerStepAndItsVectorsDoNotDependOnThePasses) {
  for (int pooling : {1, 3}) {
    auto model = embedding_model(pooling);
    ASSERT_TRUE(model);
    auto pool = model->new_kv_pool(64, DType::F16);
    ASSERT_TRUE(pool.ok());
    auto whole = run_job(*model, *pool.value(), 512);  // one pass
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    auto job = EmbeddingJob::start(*model, *pool.value(), inputs());
    ASSERT_TRUE(job.ok());
    int steps = 0;
    while (!job->finished()) {
      auto s = job->step(16);  // 69 tokens in passes of 16: 5 steps
      ASSERT_TRUE(s.ok()) << s.error().message;
      ASSERT_EQ(s.value(), EmbeddingJob::Step::Ran);
      ASSERT_LT(++steps, 10);
    }
    EXPECT_EQ(steps, 5);
    const auto cut = job->vectors();
    ASSERT_EQ(cut.size(), whole->size());
    for (size_t i = 0; i < cut.size(); i++) {
      double norm = 0;
      for (size_t d = 0; d < cut[i].size(); d++) {
        EXPECT_NEAR(cut[i][d], (*whole)[i][d], 1e-5) << "input " << i << " pooling " << pooling;
        norm += (double)cut[i][d] * cut[i][d];
      }
      EXPECT_NEAR(norm, 1.0, 1e-5);
    }
    EXPECT_EQ(pool.value()->used_blocks(), 0) << "a finished job gives every block back";
  }
}

TEST(Embedder, AFullPoolIsNoRoomUntilBlocksComeBack) {
  auto model = embedding_model(3);
  ASSERT_TRUE(model);
  auto pool = model->new_kv_pool(8, DType::F16);
  ASSERT_TRUE(pool.ok());
  BlockTable hog(*pool.value());
  ASSERT_TRUE(hog.grow_to(8 * pool.value()->block_tokens(), 0));  // every block
  auto job = EmbeddingJob::start(*model, *pool.value(), inputs());
  ASSERT_TRUE(job.ok());
  auto s = job->step(512);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value(), EmbeddingJob::Step::NoRoom);
  EXPECT_FALSE(job->finished());
  EXPECT_FALSE(run_job(*model, *pool.value(), 512).ok());
  hog.release();
  while (!job->finished()) {
    auto r = job->step(512);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r.value(), EmbeddingJob::Step::Ran);
  }
  EXPECT_EQ(job->vectors().size(), 4u);
}

TEST(Embedder, RefusesAGenerationModelAndAnEmptyInput) {
  auto gen = embedding_model(-1);
  ASSERT_TRUE(gen);
  auto pool = gen->new_kv_pool(8, DType::F16);
  ASSERT_TRUE(pool.ok());
  auto r = EmbeddingJob::start(*gen, *pool.value(), inputs());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not an embedding model"), std::string::npos) << r.error().message;
  auto emb = embedding_model(1);
  auto pool2 = emb->new_kv_pool(8, DType::F16);
  auto e = EmbeddingJob::start(*emb, *pool2.value(), {{1, 2}, {}});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("input 1 has no tokens"), std::string::npos) << e.error().message;
}

}  // namespace
}  // namespace tandem
