#pragma once
// A thread team for the forward pass that degrades gracefully on a shared machine.
//
// The caller runs the pass; each op it shares out (a product's tiles, attention's heads) is a
// range of items that the caller and the members claim in chunks. The caller returns when every
// item is done, not when every member has turned up: a member the OS has preempted costs the
// chunk it holds (a share), never the op, and one that wakes late finds the op claimed and goes
// back to waiting. Members spin briefly between ops (decode issues one every few microseconds),
// then block on a futex, so an idle team leaves the cores to other programs; a member whose
// core another busy program shares sits out for 1-4 s at a time (see member_loop, note_lag).
//
// OpenMP's team, by contrast, meets at a barrier after every op: with one core busy elsewhere,
// every barrier waited for a descheduled member and decode fell 180x (issue 35).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace tandem::cpu {

// How an op's items go out: chunks of at least min_chunk items; with parts_per_thread > 0 a
// claim takes remaining / (parts_per_thread x team size) items (guided: long sequential runs
// first, short ones at the end so the threads finish together).
struct Split {
  int64_t min_chunk = 1;
  int parts_per_thread = 0;
};

class WorkTeam {
 public:
  // threads: the caller plus threads - 1 members (threads <= 1: the caller alone).
  explicit WorkTeam(int threads);
  ~WorkTeam();
  WorkTeam(const WorkTeam&) = delete;
  WorkTeam& operator=(const WorkTeam&) = delete;

  int size() const { return (int)members_.size() + 1; }

  // f(begin, end, slot) over [0, n) in chunks; slot in [0, size()) names the running thread
  // (0: the caller). Returns once every item has run, each exactly once. A call from inside an
  // item (on any thread of the team) runs the items inline.
  template <typename F>
  void run(int64_t n, Split split, F&& f) {
    if (n <= 0) return;
    if (members_.empty() || n == 1 || inside_item()) {
      f(int64_t{0}, n, 0);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    run_op(n, split, (void*)&f, [](void* fn, int64_t b, int64_t e, int slot) { (*static_cast<Fn*>(fn))(b, e, slot); });
  }

  // Ops started since the team was made (all of them, the inline ones excepted).
  uint64_t ops() const { return op_; }
  // Times a member sat out a stretch because its core was busy with another program.
  int benched() const { return benched_.load(std::memory_order_relaxed); }

 private:
  using Call = void (*)(void*, int64_t, int64_t, int);
  static bool inside_item();  // the calling thread is running an item (of any team)
  void run_op(int64_t n, Split split, void* fn, Call call);
  void member_loop(int slot);
  // Claims and runs chunks of the open op until it has none left.
  void run_chunks(int slot);
  // The caller waited long for the members flagged in `late` (bit per slot): two such waits
  // within kLagWindowMs ask that member to sit out (see member_loop).
  void note_lag(uint64_t late);

  // What the caller sees of each member: whether it holds items now, and its request that the
  // member sit out; the caller's own count of the member's recent lags.
  struct alignas(64) Member {
    std::atomic<bool> holding{false};
    std::atomic<bool> sit_out{false};
    int lags = 0;                                      // the caller's
    std::chrono::steady_clock::time_point first_lag;  // the caller's
  };
  std::unique_ptr<Member[]> state_;  // [size()], slot 0 (the caller) unused

  // claim_: (op << 32) | next item; kClosed while the caller writes an op's fields, so that a
  // member still holding the last op's claim word cannot take items with the next op's size.
  static constexpr uint32_t kClosed = 0xFFFFFFFFu;
  alignas(64) std::atomic<uint64_t> claim_{kClosed};
  alignas(64) std::atomic<uint32_t> done_{0};
  // The op's fields: written by the caller once per op, read by every claim (a line of their own).
  alignas(64) std::atomic<int64_t> n_{0};
  std::atomic<int64_t> min_chunk_{1};
  std::atomic<int> parts_{0};
  std::atomic<void*> fn_{nullptr};
  std::atomic<Call> call_{nullptr};
  alignas(64) std::atomic<uint32_t> epoch_{0};  // members wait on this (a futex word)
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_waiting_{false};
  std::atomic<bool> stop_{false};
  uint32_t op_ = 0;
  std::atomic<int> benched_{0};  // times a member sat out a contended stretch
  std::vector<std::thread> members_;
};

// The team the calling thread's forward pass runs on (set by CpuBackend for a pass), or null.
WorkTeam* current_team();

// Makes team the calling thread's current team for this scope.
class TeamScope {
 public:
  explicit TeamScope(WorkTeam* team);
  ~TeamScope();
  TeamScope(const TeamScope&) = delete;
  TeamScope& operator=(const TeamScope&) = delete;

 private:
  WorkTeam* saved_;
};

}  // namespace tandem::cpu

#include <omp.h>

namespace tandem::cpu {

// f(begin, end, slot) over [0, n): on the current team when the thread has one, else (kernels
// called directly, as tests and benches do) in an OpenMP region with the same chunks.
template <typename F>
void parallel_for(int64_t n, Split split, F&& f) {
  if (WorkTeam* team = current_team()) return team->run(n, split, f);
  if (n <= 0) return;
  if (n == 1 || omp_in_parallel() || omp_get_max_threads() == 1) return f(int64_t{0}, n, 0);
  if (split.parts_per_thread > 0) {
#pragma omp parallel for schedule(guided)
    for (int64_t i = 0; i < n; i++) f(i, i + 1, omp_get_thread_num());
    return;
  }
  const int64_t chunk = std::max<int64_t>(1, split.min_chunk);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < n; b += chunk) f(b, std::min(n, b + chunk), omp_get_thread_num());
}

}  // namespace tandem::cpu
