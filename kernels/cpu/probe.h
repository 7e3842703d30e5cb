// Short probes of this machine's two roofs, so reports compare each phase with the machine it
// ran on rather than with a datasheet: the read bandwidth from memory (decode's roof) and the
// float FMA throughput of the kernels' instruction set (prefill's roof).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kernels/cpu/isa.h"

namespace tandem::cpu {

struct MachinePeaks {
  double read_bytes_per_s = 0;  // median of several passes over a buffer far larger than the caches
  double flops_per_s = 0;       // independent FMA chains on every thread, f32
  int threads = 0;
  size_t probe_bytes = 0;
  Isa isa = Isa::Scalar;
  // Arithmetic intensity (FLOP/byte) where the two roofs meet.
  double ridge() const { return read_bytes_per_s > 0 ? flops_per_s / read_bytes_per_s : 0; }
};

// A buffer far larger than the caches, touched once by the threads that will read it; each
// pass() sums all of it with `threads` threads and returns bytes/s. Keeping one lets a
// benchmark probe the memory between its runs: on a shared host the bandwidth drifts by
// tens of percent within a minute, so a probe taken beside a run measures that run's roof.
class ReadProbe {
 public:
  ReadProbe(int threads, size_t bytes = size_t(512) << 20);
  double pass();
  size_t bytes() const { return n_ * sizeof(float); }

 private:
  int threads_;
  size_t n_;
  std::unique_ptr<float[]> buf_;
};

// Sums `bytes` of floats with `threads` threads, `passes` times; returns the median bytes/s.
double measure_read_bandwidth(int threads, size_t bytes = size_t(512) << 20, int passes = 5);
// The median of some bytes/s readings (0 for none).
double median_rate(std::vector<double> rates);
// Runs independent FMA chains for about `seconds` on each thread; returns FLOP/s.
double measure_peak_flops(Isa isa, int threads, double seconds = 0.2);
MachinePeaks measure_machine(Isa isa, int threads);

namespace detail {
// One thread's FMA loop: `iters` iterations of the ISA's chains; returns its flop count and
// writes a value the compiler cannot discard.
double fma_loop_scalar(long iters, float* sink);
double fma_loop_avx2(long iters, float* sink);
// One thread's read pass; returns a sum the compiler cannot discard.
float read_pass_scalar(const float* p, size_t n);
float read_pass_avx2(const float* p, size_t n);
}  // namespace detail

}  // namespace tandem::cpu
