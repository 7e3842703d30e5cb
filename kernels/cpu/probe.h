// Short probes of this machine's roofs, so reports compare each phase with the machine it ran
// on rather than with a datasheet: the read bandwidth from memory (decode's roof), and the
// throughput of the instructions the products run (prefill's roof): f32 FMA at the ISA's
// width for float activations, 8-bit dot products (VPDPBUSD, or AVX2's VPMADDUBSW + VPMADDWD)
// for 8-bit activations against quantized weights.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"

namespace tandem::cpu {

struct MachinePeaks {
  // The best of several passes over a buffer far larger than the caches: a roof bounds what
  // the memory can deliver, and on a shared host most passes get less (seen: 26 to 78 GB/s
  // within a minute). read_min/read_median say how far they spread.
  double read_bytes_per_s = 0;
  double read_min = 0, read_median = 0;
  double flops_per_s = 0;     // independent FMA chains on every thread, f32, at the ISA's width
  double int8_ops_per_s = 0;  // independent 8-bit dot-product chains (2 ops per multiply-add)
  int threads = 0;
  size_t probe_bytes = 0;
  Isa isa = Isa::Scalar;
  std::string label;  // what was probed, for reports: "2 threads, avx512", or a GPU's name
  // Set when a measured phase moved bytes faster than the probes read them: the roof was
  // raised to that phase's rate (a roof decode beats is a wrong roof, not a >100% figure).
  double raised_from = 0;  // the probes' best before it was raised (0: not raised)
  // The compute roof of products with 8-bit activations (int8) or float ones.
  double compute_roof(bool int8) const { return int8 && int8_ops_per_s > 0 ? int8_ops_per_s : flops_per_s; }
  // Raises the read roof to a rate some phase measurably reached, when the probes read less.
  void raise_read_roof(double bytes_per_s) {
    if (bytes_per_s <= read_bytes_per_s) return;
    if (raised_from == 0) raised_from = read_bytes_per_s;
    read_bytes_per_s = bytes_per_s;
  }
  // Arithmetic intensity (FLOP/byte) where the float (or 8-bit) roof meets the read roof.
  double ridge(bool int8 = false) const { return read_bytes_per_s > 0 ? compute_roof(int8) / read_bytes_per_s : 0; }
};

// Bytes/s readings of several probe passes: the best (the roof), the median and the least.
struct ReadRates {
  double best = 0, median = 0, least = 0;
};
ReadRates summarize_rates(std::vector<double> rates);

// A buffer of the size decode reads per token (the model's weights: a small model's partly
// stays in the last-level cache between tokens, and so does this), touched once by the threads
// that will read it. Each pass() reads all of it as decode's products do: every thread its own
// contiguous range, as several interleaved streams (a product streams a tile's rows at once),
// and returns bytes/s. Keeping one lets a benchmark probe the memory between its runs: on a
// shared host the bandwidth drifts by tens of percent within a minute, so a probe taken
// beside a run measures that run's roof; best() of several short passes is the roof.
class ReadProbe {
 public:
  ReadProbe(int threads, size_t bytes = size_t(512) << 20);
  double pass();
  // The best of `passes` passes (each also added to rates when given).
  double best(int passes, std::vector<double>* rates = nullptr);
  size_t bytes() const { return n_ * sizeof(float); }

 private:
  int threads_;
  size_t n_;
  std::unique_ptr<float[]> buf_;
};

// Sums `bytes` of floats with `threads` threads, `passes` times.
ReadRates measure_read_bandwidth(int threads, size_t bytes = size_t(512) << 20, int passes = 15);
// The probe size for a working set of `bytes` (what decode reads per token): that size, kept
// within [1 MiB, 2 GiB] so the probe neither fits in L2 nor takes long.
size_t probe_bytes_for(double working_set_bytes);
// The median of some bytes/s readings (0 for none).
double median_rate(std::vector<double> rates);
// Runs independent FMA chains for about `seconds` on each thread; returns FLOP/s.
double measure_peak_flops(Isa isa, int threads, double seconds = 0.2);
// The same for the 8-bit dot products the quantized kernels of `isa` run; returns ops/s.
double measure_peak_int8_ops(Isa isa, int threads, double seconds = 0.2);
MachinePeaks measure_machine(Isa isa, int threads, size_t probe_bytes = size_t(512) << 20);

namespace detail {
// One thread's FMA loop: `iters` iterations of the ISA's chains; returns its flop count and
// writes a value the compiler cannot discard.
double fma_loop_scalar(long iters, float* sink);
double fma_loop_avx2(long iters, float* sink);
double fma_loop_avx512(long iters, float* sink);
double int8_loop_scalar(long iters, float* sink);
double int8_loop_avx2(long iters, float* sink);
double int8_loop_avx512(long iters, float* sink);
// One thread's read pass; returns a sum the compiler cannot discard.
float read_pass_scalar(const float* p, size_t n);
float read_pass_avx2(const float* p, size_t n);
}  // namespace detail

}  // namespace tandem::cpu
