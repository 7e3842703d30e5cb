// `serve --disaggregate P:D`'s checks (apps/serve_disaggregated.h over engine/disaggregation.h)
// for a job of a given size, without mpirun: the forms it takes, the malformed ones, counts
// that do not add up to the job, and the options it refuses beside it, each with an error
// that says what to do.
#include <gtest/gtest.h>

#include <cmath>

#include "apps/serve_disaggregated.h"
#include "engine/disaggregation.h"

namespace tandem {
namespace {

apps::DisaggregateArgs args(const std::string& spec) {
  apps::DisaggregateArgs a;
  a.spec = spec;
  return a;
}

std::string refusal(const apps::DisaggregateArgs& a, int ranks) {
  auto o = apps::disaggregation_options(a, ranks);
  return o.ok() ? "" : o.error().message;
}

TEST(DisaggregationOptions, ValidSplits) {
  auto o = apps::disaggregation_options(args("1:1"), 2);
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->n_prefill, 1);
  EXPECT_EQ(o->n_decode, 1);
  o = apps::disaggregation_options(args("3:1"), 4);  // ranks 1..3 prefill, rank 0 decodes
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->n_prefill, 3);
  EXPECT_EQ(o->n_decode, 1);
  apps::DisaggregateArgs a = args("2:1");
  a.rank_timeout = 2.5;
  o = apps::disaggregation_options(a, 3);
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->peer_timeout_s, 2.5);
  EXPECT_EQ(parse_disaggregate("007:1", 8).n_prefill, 7);  // leading zeros are still decimal
}

TEST(DisaggregationOptions, MalformedSpecsAreRefused) {
  for (const char* spec : {"", ":", "1", "1:", ":1", "1:1:1", "a:b", "1:b", "1.5:1", "1;1", " 1:1", "1: 1", "1:1 ", "+1:1",
                           "1:+1", "-1:3", "1:-1", "0x1:1", "99999999999999999999:1", "1:99999999999999999999"}) {
    SCOPED_TRACE(spec);
    const DisaggregateSplit s = parse_disaggregate(spec, 2);
    EXPECT_NE(s.error, "");
    EXPECT_EQ(s.n_prefill, 0);
    const std::string e = refusal(args(spec), 2);
    EXPECT_NE(e.find(std::string("--disaggregate '") + spec + "': give P:D"), std::string::npos) << e;
  }
}

TEST(DisaggregationOptions, ZeroPrefillOrDecodeRanksAreRefused) {
  for (const char* spec : {"0:2", "2:0", "0:0", "00:2"}) {
    const std::string e = refusal(args(spec), 2);
    EXPECT_NE(e.find("each a whole number of at least 1"), std::string::npos) << spec << ": " << e;
  }
}

TEST(DisaggregationOptions, CountsMustAddUpToTheJob) {
  EXPECT_EQ(refusal(args("1:1"), 3), "--disaggregate 1:1: 1 + 1 ranks, but this job has 3; start it as mpirun -np 2 tandem serve ...");
  EXPECT_NE(refusal(args("3:1"), 2).find("3 + 1 ranks, but this job has 2; start it as mpirun -np 4"), std::string::npos);
  // No overflow where P + D passes an int: the sum is what it says.
  EXPECT_NE(refusal(args("2147483647:1"), 2).find("mpirun -np 2147483648 "), std::string::npos) << refusal(args("2147483647:1"), 2);
}

TEST(DisaggregationOptions, NotUnderMpirunIsRefused) {
  EXPECT_NE(refusal(args("1:1"), 1).find("not an MPI job of several ranks; start it as mpirun -np N"), std::string::npos)
      << refusal(args("1:1"), 1);
}

TEST(DisaggregationOptions, TensorParallelismAndDraftModelAreRefused) {
  apps::DisaggregateArgs a = args("1:1");
  a.tensor_parallel = 2;
  EXPECT_NE(refusal(a, 2).find("--disaggregate with --tensor-parallel 2"), std::string::npos) << refusal(a, 2);
  a.tensor_parallel = 1;  // one rank's worth: nothing to split
  EXPECT_EQ(refusal(a, 2), "");
  a = args("1:1");
  a.draft_model = true;
  EXPECT_NE(refusal(a, 2).find("--disaggregate with --draft-model"), std::string::npos) << refusal(a, 2);
  EXPECT_NE(refusal(a, 2).find("--speculative lookup"), std::string::npos) << refusal(a, 2);
}

TEST(DisaggregationOptions, RankTimeoutMustBePositive) {
  apps::DisaggregateArgs a = args("1:1");
  for (double t : {0.0, -1.0, std::nan("")}) {
    a.rank_timeout = t;
    EXPECT_NE(refusal(a, 2).find("--rank-timeout"), std::string::npos) << t << ": " << refusal(a, 2);
  }
}

TEST(DisaggregationOptions, SeveralDecodeRanks) {
  auto o = apps::disaggregation_options(args("1:2"), 3);
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->n_prefill, 1);
  EXPECT_EQ(o->n_decode, 2);
  o = apps::disaggregation_options(args("2:3"), 5);
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->n_decode, 3);
  EXPECT_NE(refusal(args("1:2"), 2).find("1 + 2 ranks, but this job has 2"), std::string::npos) << refusal(args("1:2"), 2);
}

TEST(HandoffCost, WholeBlocksOfEveryLayer) {
  const HandoffCost c = handoff_cost(1000.0, 33, 16);  // 3 blocks, the last partly used
  EXPECT_EQ(c.blocks, 3);
  EXPECT_EQ(c.bytes, 48 * 1000.0);
  EXPECT_DOUBLE_EQ(c.seconds_at(12.5), 48000.0 / 12.5e9);
}

}  // namespace
}  // namespace tandem
