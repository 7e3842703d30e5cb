#include "kernels/cpu/work_team.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace tandem::cpu {

namespace {

thread_local WorkTeam* t_team = nullptr;
thread_local bool t_in_item = false;  // see WorkTeam::inside_item

void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#endif
}

// Spin until done() or spin_us have passed; true when done() came first.
template <typename Done>
bool spin_until(Done done, int spin_us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (int i = 1;; i++) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= until) return done();
  }
}

// Members keep spinning this long after an op: decode issues its next op within a few
// microseconds (element-wise work on the caller), so they are there for it; longer gaps
// (sampling, the scheduler between serving steps) put them to sleep and free the core.
constexpr int kMemberSpinUs = 50;
// The caller spins this long for members to finish their last chunks, then sleeps, so that a
// preempted member that shares its core gets the core back.
constexpr int kCallerSpinUs = 20;
// A wait this long for a member's items, twice within kLagWindowMs, asks it to sit out: the
// caller sees a preempted member within a few of its time slices, faster than the member's own
// runqueue windows (60 ms).
constexpr int kLagMs = 2, kLagWindowMs = 100;

}  // namespace

WorkTeam* current_team() { return t_team; }

bool WorkTeam::inside_item() { return t_in_item; }

TeamScope::TeamScope(WorkTeam* team) : saved_(t_team) { t_team = team; }
TeamScope::~TeamScope() { t_team = saved_; }

WorkTeam::WorkTeam(int threads) : state_(new Member[(size_t)std::max(1, threads)]) {
  for (int slot = 1; slot < threads; slot++) members_.emplace_back([this, slot] { member_loop(slot); });
}

WorkTeam::~WorkTeam() {
  stop_.store(true, std::memory_order_seq_cst);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  for (std::thread& t : members_) t.join();
}

void WorkTeam::run_op(int64_t n, Split split, void* fn, Call call) {
  op_++;
  const uint64_t tag = (uint64_t)op_ << 32;
  // Close the claim word before the fields change: a member that read the last op's word
  // (exhausted) and then reads this op's larger n fails its compare-and-swap.
  claim_.store(tag | kClosed, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  n_.store(n, std::memory_order_relaxed);
  min_chunk_.store(std::max<int64_t>(1, split.min_chunk), std::memory_order_relaxed);
  parts_.store(split.parts_per_thread, std::memory_order_relaxed);
  fn_.store(fn, std::memory_order_relaxed);
  call_.store(call, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(tag, std::memory_order_release);  // open
  epoch_.store(op_, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();

  const auto start = std::chrono::steady_clock::now();
  run_chunks(0);
  const uint32_t total = (uint32_t)n;
  auto finished = [&] { return done_.load(std::memory_order_acquire) == total; };
  if (spin_until(finished, kCallerSpinUs)) return;
  // The members still holding items now are the ones the caller waits for.
  uint64_t late = 0;
  for (int slot = 1; slot < size() && slot < 64; slot++)
    if (state_[slot].holding.load(std::memory_order_relaxed)) late |= uint64_t{1} << slot;
  const auto wait_from = std::chrono::steady_clock::now();
  caller_waiting_.store(true, std::memory_order_seq_cst);
  for (uint32_t d; (d = done_.load(std::memory_order_seq_cst)) != total;) done_.wait(d, std::memory_order_seq_cst);
  caller_waiting_.store(false, std::memory_order_relaxed);
  // A wait of milliseconds, and longer than twice the caller's own share of the op, is a
  // member that another program took the core from (items are microseconds; a big op's
  // last chunks take about as long as the caller's).
  const auto waited = std::chrono::steady_clock::now() - wait_from;
  if (late && waited > std::chrono::milliseconds(kLagMs) && waited > 2 * (wait_from - start)) note_lag(late);
}

void WorkTeam::note_lag(uint64_t late) {
  const auto now = std::chrono::steady_clock::now();
  for (int slot = 1; slot < size() && slot < 64; slot++) {
    if (!(late >> slot & 1)) continue;
    Member& m = state_[slot];
    if (now - m.first_lag > std::chrono::milliseconds(kLagWindowMs)) m.first_lag = now, m.lags = 0;
    if (++m.lags >= 2) {
      m.lags = 0;
      m.sit_out.store(true, std::memory_order_relaxed);
    }
  }
}

void WorkTeam::run_chunks(int slot) {
  const int team = size();
  // Items this thread ran, added to done_ once, when the op has none left to claim: done_ is
  // the line the caller polls, and an add per chunk would move it between the cores for every
  // claim (decode's ops are a few microseconds; each transfer is ~0.1-0.2 us).
  uint32_t ran = 0;
  int64_t n_seen = 0;
  for (;;) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    const uint32_t next = (uint32_t)c;
    if (next == kClosed) break;
    // Seqlock read of the op's fields: valid only if the claim word is unchanged at the CAS.
    const int64_t n = n_.load(std::memory_order_relaxed);
    const int64_t min_chunk = min_chunk_.load(std::memory_order_relaxed);
    const int parts = parts_.load(std::memory_order_relaxed);
    void* fn = fn_.load(std::memory_order_relaxed);
    const Call call = call_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((int64_t)next >= n) break;
    const int64_t left = n - next;
    int64_t take = min_chunk;
    if (parts > 0) take = std::max(take, left / ((int64_t)parts * team));
    take = std::min(take, left);
    if (!claim_.compare_exchange_weak(c, c + (uint64_t)take, std::memory_order_acq_rel, std::memory_order_relaxed))
      continue;
    t_in_item = true;
    if (slot > 0) state_[slot].holding.store(true, std::memory_order_relaxed);
    call(fn, next, next + take, slot);
    if (slot > 0) state_[slot].holding.store(false, std::memory_order_relaxed);
    t_in_item = false;
    ran += (uint32_t)take;
    n_seen = n;  // the claim succeeded, so n was this op's
  }
  if (ran == 0) return;
  const uint32_t now = done_.fetch_add(ran, std::memory_order_seq_cst) + ran;
  if (now == (uint32_t)n_seen && caller_waiting_.load(std::memory_order_seq_cst)) done_.notify_one();
}

// Seconds the calling thread has spent runnable but waiting for a core (the kernel's
// schedstat), or -1 where the kernel does not say.
double runqueue_wait_s() {
  const int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  unsigned long long run = 0, wait = 0;
  if (sscanf(buf, "%llu %llu", &run, &wait) != 2) return -1;
  return (double)wait * 1e-9;
}

void WorkTeam::member_loop(int slot) {
  uint32_t seen = 0;
  // A member that waits for a core for much of its time shares the core with another busy
  // program. There it makes the pass slower than the other threads would be without it: its
  // spinning takes time the caller (the pass's critical path) needs, and the items it holds
  // wait while it is off the core. So it sits out (sleeps) for kBenchMs, then tries again; the
  // others share its items meanwhile. On two cores beside one busy process, -t 2 then runs as
  // -t 1 does. A background job at low priority takes too little of the core to count.
  // Sitting out starts at kBenchMs and doubles (up to kMaxBenchMs) each time the member finds
  // its core contended again right after coming back, so a long-running busy neighbour costs
  // the detection windows ever more rarely; a quiet return resets it.
  constexpr int kCheckMs = 20, kBenchMs = 1000, kMaxBenchMs = 4000;
  // Of the wall time spent waiting for a core. Beside one busy process a member waits 40-90%
  // of each window; a server's own traffic (its I/O threads, a client on the same machine at
  // 64 streams) makes it wait 0-10%, now and then 20-60% for one window. At 10% such bursts
  // benched it, and serving lost half its speed for seconds at a time.
  constexpr double kContendedShare = 0.30;
  double last_wait = runqueue_wait_s();
  int waited_windows = 0, bench_ms = kBenchMs;
  auto last_check = std::chrono::steady_clock::now();
  auto back_at = last_check - std::chrono::hours(1);  // when the member last came back from sitting out
  for (;;) {
    auto fresh = [&] { return epoch_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(fresh, kMemberSpinUs)) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      epoch_.wait(seen, std::memory_order_seq_cst);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      continue;  // spin again: the next op is usually right behind this one
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = epoch_.load(std::memory_order_acquire);
    run_chunks(slot);
    // The caller saw this member late twice in a row of milliseconds (note_lag): sit out now.
    const bool asked = state_[slot].sit_out.exchange(false, std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (!asked && (last_wait < 0 || now - last_check < std::chrono::milliseconds(kCheckMs))) continue;
    const double wait = asked || last_wait < 0 ? 0 : runqueue_wait_s();
    const bool waited = !asked && wait - last_wait > kContendedShare * std::chrono::duration<double>(now - last_check).count();
    // Three windows in a row: fewer can be a burst (a daemon waking, the bench's probe threads
    // starting). Right after sitting out, one window decides: the neighbour that was busy
    // then most likely still is, and every contended window costs the pass.
    waited_windows = waited ? waited_windows + 1 : 0;
    const bool just_back = now - back_at < std::chrono::milliseconds(5 * kCheckMs);
    if (asked || waited_windows >= 3 || (waited && just_back)) {
      waited_windows = 0;
      const bool again = now - back_at < std::chrono::milliseconds(2 * bench_ms);
      bench_ms = again ? std::min(kMaxBenchMs, bench_ms * 2) : kBenchMs;
      benched_.fetch_add(1, std::memory_order_relaxed);
      // In steps, so that the team's destructor waits at most one step for it.
      for (int ms = 0; ms < bench_ms && !stop_.load(std::memory_order_acquire); ms += 50)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (stop_.load(std::memory_order_acquire)) return;
      seen = epoch_.load(std::memory_order_acquire);
      back_at = std::chrono::steady_clock::now();
      state_[slot].sit_out.store(false, std::memory_order_relaxed);  // lags from before it sat out
    }
    last_wait = runqueue_wait_s();
    last_check = std::chrono::steady_clock::now();
  }
}

}  // namespace tandem::cpu
