// Serving metrics in Prometheus text format: TTFT and TPOT histograms, request counters,
// token counters, and gauges the serving loop sets each step (queue, running, KV blocks).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Lines "name_bucket{le=...} n", name_sum, name_count.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Gauges {
  int64_t waiting = 0, running = 0;
  int64_t kv_blocks_used = 0, kv_blocks_free = 0, kv_blocks_cached = 0, kv_blocks_total = 0;
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0, preemptions = 0, steps = 0;
  int64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding (lookup and draft model)
  int64_t draft_passes = 0;                          // the draft model's forward passes
  double tokens_per_s = 0;  // generated tokens per second over the last few seconds
};

class Metrics {
 public:
  Metrics();
  void request_started();
  void request_finished(const std::string& reason);  // "stop", "length", "cancelled", "error"
  void request_rejected();                           // 4xx before reaching the engine
  void observe_ttft(double s);
  void observe_tpot(double s);
  void set_gauges(const Gauges& g);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, tpot_;
  uint64_t started_ = 0, rejected_ = 0;
  uint64_t finished_stop_ = 0, finished_length_ = 0, finished_cancelled_ = 0, finished_error_ = 0;
  Gauges g_;
};

}  // namespace tandem::server
