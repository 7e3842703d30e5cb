// Serving metrics in Prometheus text format: TTFT and TPOT histograms, request counters,
// token counters, and gauges the serving loop sets each step (queue, running, KV blocks).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/decode_router.h"

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

// Every counter twice: for the whole server and for the tenant (API key) of the request, so a
// tenant's /metrics shows its own requests only: another tenant's prompt and output lengths
// and cache hits must not be readable from counter deltas. "" is the tenant of a server without
// keys (its view is the whole server's).
class Metrics {
 public:
  Metrics();
  void request_started(const std::string& tenant = "");
  // "stop", "length", "cancelled", "error"; the request's prompt, cached and generated tokens.
  void request_finished(const std::string& reason, const std::string& tenant = "", int64_t prompt_tokens = 0,
                        int64_t cached_tokens = 0, int64_t generated_tokens = 0);
  void request_rejected(const std::string& tenant = "");  // 4xx before reaching the engine
  void observe_ttft(double s, const std::string& tenant = "");
  void observe_tpot(double s, const std::string& tenant = "");
  void set_gauges(const Gauges& g);
  // Disaggregated serving (engine/decode_router.h): one request's TTFT in parts and its KV
  // transfer; the prefill ranks' state and this decode rank's seconds in passes.
  void observe_handoff(const HandoffTiming& t);
  void set_router(const RouterStats& s, double decode_busy_s);
  // The whole server: every counter and the engine's gauges (KV blocks, queue, steps).
  std::string render() const;
  // One tenant's own requests: its counters and histograms, nothing engine-wide.
  std::string render_tenant(const std::string& tenant) const;

 private:
  struct Counters {
    Counters();
    Histogram ttft, tpot;
    uint64_t started = 0, rejected = 0;
    uint64_t finished_stop = 0, finished_length = 0, finished_cancelled = 0, finished_error = 0;
    uint64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0;
  };
  Counters* tenant_locked(const std::string& tenant);  // null for "" (the server's own view)
  std::string render_counters(const Counters& c) const;
  void render_disaggregation(std::string& o) const;  // metrics_disaggregation.cpp

  mutable std::mutex mu_;
  Counters all_;
  std::map<std::string, Counters> tenants_;  // at most one per configured key
  Gauges g_;
  struct Handoffs {  // disaggregated serving only
    Handoffs();
    bool on = false;
    Histogram queue, prefill, transfer, stream;
    RouterStats router;
    double decode_busy_s = 0;
  } handoffs_;
};

}  // namespace tandem::server
