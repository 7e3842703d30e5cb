// The forward pass's thread team (kernels/cpu/work_team.h): every item runs exactly once,
// whatever the op sizes, chunk policies and timing, and a team whose members fell asleep still
// finishes every op with them. (That a busy core costs a share, not the pass, is measured by
// bench/contend.sh: it needs a competing process, not a test.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kernels/cpu/work_team.h"

namespace tandem::cpu {
namespace {

// Counts how often each item ran; any count but 1 is a lost or repeated item.
struct Tally {
  std::vector<std::atomic<int>> runs;
  explicit Tally(int64_t n) : runs((size_t)n) {}
  void add(int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) runs[(size_t)i].fetch_add(1, std::memory_order_relaxed);
  }
  int64_t wrong() const {
    int64_t w = 0;
    for (const auto& r : runs) w += r.load() != 1;
    return w;
  }
};

TEST(WorkTeam, EveryItemOnceForEachSplit) {
  WorkTeam team(3);
  EXPECT_EQ(team.size(), 3);
  for (Split split : {Split{1, 0}, Split{7, 0}, Split{1, 1}, Split{2, 2}, Split{1000, 0}})
    for (int64_t n : {1, 2, 3, 17, 64, 1000, 4097}) {
      Tally t(n);
      std::atomic<int> bad_slot{0};
      team.run(n, split, [&](int64_t b, int64_t e, int slot) {
        if (slot < 0 || slot >= team.size() || b >= e) bad_slot++;
        t.add(b, e);
      });
      EXPECT_EQ(t.wrong(), 0) << "n " << n << " min_chunk " << split.min_chunk << " parts " << split.parts_per_thread;
      EXPECT_EQ(bad_slot.load(), 0);
    }
}

// The race this team once had: a member holding the last op's exhausted claim word read the
// next op's larger size and took items again. Ops whose sizes jump up and down, back to back,
// with no gap for the members to fall asleep in, for a few seconds on a four-member team.
TEST(WorkTeam, NoItemRunsTwiceWhenOpSizesJump) {
  WorkTeam team(4);
  const int64_t sizes[] = {2, 64, 3, 500, 5, 9, 1, 33};
  std::vector<std::atomic<int>> runs(512);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int64_t ops = 0, wrong = 0;
  while (std::chrono::steady_clock::now() < until && ops < 400000) {
    const int64_t n = sizes[ops % 8];
    for (int64_t i = 0; i < n; i++) runs[(size_t)i].store(0, std::memory_order_relaxed);
    team.run(n, Split{1, ops % 3 == 0 ? 1 : 0}, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; i++) runs[(size_t)i].fetch_add(1, std::memory_order_relaxed);
    });
    for (int64_t i = 0; i < n; i++) wrong += runs[(size_t)i].load(std::memory_order_relaxed) != 1;
    ops++;
  }
  EXPECT_EQ(wrong, 0) << "over " << ops << " ops";
  EXPECT_GT(ops, 1000);
}

// Between bursts the members sleep (futex) instead of spinning; a burst after a long pause
// still runs every item, and the members join in again.
TEST(WorkTeam, WakesAfterSleeping) {
  WorkTeam team(3);
  for (int round = 0; round < 3; round++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // members spin 50 us, then sleep
    Tally t(300);
    std::atomic<int> by_members{0};
    team.run(300, Split{1, 0}, [&](int64_t b, int64_t e, int slot) {
      if (slot != 0) by_members += (int)(e - b);
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // long enough for a member to wake
      t.add(b, e);
    });
    EXPECT_EQ(t.wrong(), 0);
    EXPECT_GT(by_members.load(), 0) << "round " << round << ": no member woke up for 300 items";
  }
}

// A call from inside an item (or from a member) runs inline instead of deadlocking the team.
TEST(WorkTeam, NestedRunsInline) {
  WorkTeam team(2);
  Tally t(64 * 8);
  team.run(64, Split{1, 0}, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; i++)
      team.run(8, Split{1, 0}, [&](int64_t ib, int64_t ie, int) { t.add(i * 8 + ib, i * 8 + ie); });
  });
  EXPECT_EQ(t.wrong(), 0);
}

// parallel_for runs on the scope's team, and without one (kernels called directly) on OpenMP,
// every item once either way.
TEST(WorkTeam, ParallelForUsesTheCurrentTeam) {
  WorkTeam team(2);
  EXPECT_EQ(current_team(), nullptr);
  {
    TeamScope scope(&team);
    EXPECT_EQ(current_team(), &team);
    const uint64_t before = team.ops();
    Tally t(100);
    parallel_for(100, Split{3, 0}, [&](int64_t b, int64_t e, int) { t.add(b, e); });
    EXPECT_EQ(t.wrong(), 0);
    EXPECT_EQ(team.ops(), before + 1);
  }
  EXPECT_EQ(current_team(), nullptr);
  for (Split split : {Split{3, 0}, Split{1, 2}}) {
    Tally t(100);
    parallel_for(100, split, [&](int64_t b, int64_t e, int) { t.add(b, e); });
    EXPECT_EQ(t.wrong(), 0);
  }
}

// A member whose items keep the caller waiting milliseconds (as when another program has its
// core) is asked to sit out after two such waits; meanwhile and after, every item runs once.
TEST(WorkTeam, AMemberThatKeepsTheCallerWaitingSitsOut) {
  WorkTeam team(2);
  int ops = 0;
  for (; ops < 100 && team.benched() == 0; ops++) {
    Tally t(8);
    team.run(8, Split{1, 0}, [&](int64_t b, int64_t e, int slot) {
      std::this_thread::sleep_for(slot == 1 ? std::chrono::microseconds(5000) : std::chrono::microseconds(30));
      t.add(b, e);
    });
    ASSERT_EQ(t.wrong(), 0);
  }
  EXPECT_GE(team.benched(), 1) << "after " << ops << " ops";
  Tally t(64);
  team.run(64, Split{1, 0}, [&](int64_t b, int64_t e, int) { t.add(b, e); });
  EXPECT_EQ(t.wrong(), 0);
}

}  // namespace
}  // namespace tandem::cpu
