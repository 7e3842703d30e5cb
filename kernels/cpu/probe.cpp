#include "kernels/cpu/probe.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "core/timer.h"

namespace tandem::cpu {

namespace {

// Runs f(id) for id in [0, threads) on as many threads, started together: the caller is id 0,
// the others are made for the call and end with it, so none goes on spinning into what runs
// next (an OpenMP team's threads spin for tens of milliseconds after a region, which took ~5%
// from the decode repetitions the read probes run beside). Returns the seconds from the
// common start to the last thread's end.
template <typename F>
double on_threads(int threads, F f) {
  std::atomic<int> ready{0}, done{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> others;
  for (int id = 1; id < threads; id++)
    others.emplace_back([&, id] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      f(id);
      done.fetch_add(1);
    });
  while (ready.load() < threads - 1) std::this_thread::yield();
  Timer t;
  go.store(true, std::memory_order_release);
  f(0);
  done.fetch_add(1);
  while (done.load() < threads) std::this_thread::yield();
  const double s = t.seconds();
  for (std::thread& th : others) th.join();
  return s;
}

}  // namespace

namespace detail {

// Scalar twins: eight chains the compiler may vectorise with the baseline ISA.
double fma_loop_scalar(long iters, float* sink) {
  float a[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  const float m = 0.999999f, c = 1e-7f;
  for (long i = 0; i < iters; i++)
    for (float& x : a) x = x * m + c;
  float s = 0;
  for (float x : a) s += x;
  *sink = s;
  return 2.0 * 8 * (double)iters;
}

double int8_loop_scalar(long iters, float* sink) {
  uint32_t a[8] = {};  // unsigned: the sums wrap over a long probe instead of overflowing
  const uint32_t u = 3, w = 0xFFFFFFFEu;
  for (long i = 0; i < iters; i++)
    for (uint32_t& x : a) x += u * w;
  *sink = (float)(a[0] + a[7]);
  return 2.0 * 8 * (double)iters;
}

float read_pass_scalar(const float* p, size_t n) {
  float s[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) s[k] += p[i + k];
  for (; i < n; i++) s[0] += p[i];
  float t = 0;
  for (float x : s) t += x;
  return t;
}

}  // namespace detail

ReadProbe::ReadProbe(int threads, size_t bytes)
    : threads_(std::max(1, threads)), n_(bytes / sizeof(float)), buf_(new float[n_]) {
  // Each thread touches its own part first (the same part pass() gives it), so pages sit
  // near the thread that reads them.
  const size_t chunk = (n_ + threads_ - 1) / threads_;
  on_threads(threads_, [&](int id) {
    for (size_t i = std::min(n_, chunk * id), hi = std::min(n_, i + chunk); i < hi; i++) buf_[i] = (float)(i & 7);
  });
}

double ReadProbe::pass() {
  const bool avx2 = has_avx2(best_isa());
  auto read = avx2 ? detail::read_pass_avx2 : detail::read_pass_scalar;
  std::vector<float> part(threads_, 0.0f);
  const double s = on_threads(threads_, [&](int id) {
    const size_t chunk = (n_ + threads_ - 1) / threads_, lo = std::min(n_, chunk * id), hi = std::min(n_, lo + chunk);
    // kStreams interleaved streams over the thread's range, kStep floats of each at a time.
    constexpr size_t kStreams = 4, kStep = 1024;
    const size_t len = hi - lo, per = len / kStreams;
    float sum = 0;
    for (size_t off = 0; off < per; off += kStep)
      for (size_t s = 0; s < kStreams; s++) sum += read(buf_.get() + lo + s * per + off, std::min(kStep, per - off));
    if (per * kStreams < len) sum += read(buf_.get() + lo + per * kStreams, len - per * kStreams);
    part[id] = sum;
  });
  volatile float sink = 0;
  for (float x : part) sink = sink + x;
  return s > 0 ? (double)bytes() / s : 0;
}

double ReadProbe::best(int passes, std::vector<double>* rates) {
  double b = 0;
  for (int i = 0; i < passes; i++) {
    const double r = pass();
    if (rates) rates->push_back(r);
    b = std::max(b, r);
  }
  return b;
}

size_t probe_bytes_for(double working_set_bytes) {
  const double lo = double(1 << 20), hi = double(size_t(2) << 30);
  const size_t b = (size_t)std::clamp(working_set_bytes, lo, hi);
  return b & ~size_t(4095);
}

ReadRates summarize_rates(std::vector<double> rates) {
  std::erase(rates, 0.0);
  if (rates.empty()) return {};
  std::sort(rates.begin(), rates.end());
  return {rates.back(), rates[rates.size() / 2], rates.front()};
}

double median_rate(std::vector<double> rates) {
  std::erase(rates, 0.0);
  if (rates.empty()) return 0;
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

ReadRates measure_read_bandwidth(int threads, size_t bytes, int passes) {
  ReadProbe probe(threads, bytes);
  std::vector<double> rates;
  for (int pass = 0; pass < std::max(1, passes); pass++) rates.push_back(probe.pass());
  return summarize_rates(std::move(rates));
}

namespace {

// Best of three runs of `loop` on every thread for about `seconds`: ops/s.
double peak_rate(double (*loop)(long, float*), int threads, double seconds) {
  threads = std::max(1, threads);
  // Calibrate the iteration count on one thread, then run all threads together.
  float sink = 0;
  long iters = 1 << 16;
  for (;;) {
    Timer t;
    loop(iters, &sink);
    if (t.seconds() > seconds / 10 || iters > (1L << 34)) break;
    iters *= 2;
  }
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    std::vector<double> flops(threads, 0.0);
    std::vector<float> sinks(threads, 0.0f);
    const double s = on_threads(threads, [&](int id) { flops[id] = loop(iters, &sinks[id]); });
    double total = 0;
    for (double f : flops) total += f;
    if (s > 0) best = std::max(best, total / s);
  }
  return best;
}

}  // namespace

double measure_peak_flops(Isa isa, int threads, double seconds) {
  return peak_rate(isa == Isa::Avx512 ? detail::fma_loop_avx512
                   : has_avx2(isa)    ? detail::fma_loop_avx2
                                      : detail::fma_loop_scalar,
                   threads, seconds);
}

double measure_peak_int8_ops(Isa isa, int threads, double seconds) {
  return peak_rate(isa == Isa::Avx512 ? detail::int8_loop_avx512
                   : has_avx2(isa)    ? detail::int8_loop_avx2
                                      : detail::int8_loop_scalar,
                   threads, seconds);
}

MachinePeaks measure_machine(Isa isa, int threads, size_t probe_bytes) {
  MachinePeaks m;
  m.threads = threads;
  m.isa = isa;
  m.probe_bytes = probe_bytes;
  const ReadRates r = measure_read_bandwidth(threads, m.probe_bytes);
  m.read_bytes_per_s = r.best, m.read_median = r.median, m.read_min = r.least;
  m.flops_per_s = measure_peak_flops(isa, threads);
  m.int8_ops_per_s = measure_peak_int8_ops(isa, threads);
  m.label = std::to_string(threads) + " threads, " + std::string(isa_name(isa));
  return m;
}

}  // namespace tandem::cpu
