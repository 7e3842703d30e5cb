#include "server/metrics.h"

#include <fmt/format.h>

namespace tandem::server {

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) i++;
  counts_[i]++;
  sum_ += v;
  count_++;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string o = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); i++) {
    cum += counts_[i];
    o += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  o += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
  return o;
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      tpot_({0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1}) {}

void Metrics::request_started() {
  std::lock_guard<std::mutex> l(mu_);
  started_++;
}
void Metrics::request_rejected() {
  std::lock_guard<std::mutex> l(mu_);
  rejected_++;
}
void Metrics::request_finished(const std::string& reason) {
  std::lock_guard<std::mutex> l(mu_);
  if (reason == "stop") finished_stop_++;
  else if (reason == "length") finished_length_++;
  else if (reason == "cancelled") finished_cancelled_++;
  else finished_error_++;
}
void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(s);
}
void Metrics::observe_tpot(double s) {
  std::lock_guard<std::mutex> l(mu_);
  tpot_.observe(s);
}
void Metrics::set_gauges(const Gauges& g) {
  std::lock_guard<std::mutex> l(mu_);
  g_ = g;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string o;
  auto gauge = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  o += ttft_.render("tandem_time_to_first_token_seconds", "Time from request arrival to its first token.");
  o += tpot_.render("tandem_time_per_output_token_seconds", "Time between consecutive output tokens of a request.");
  counter("tandem_requests_started_total", "Requests accepted by the engine.", (double)started_);
  counter("tandem_requests_rejected_total", "Requests refused with a 4xx before reaching the engine.", (double)rejected_);
  o += "# HELP tandem_requests_finished_total Requests finished, by reason.\n# TYPE tandem_requests_finished_total counter\n";
  o += fmt::format("tandem_requests_finished_total{{reason=\"stop\"}} {}\n", finished_stop_);
  o += fmt::format("tandem_requests_finished_total{{reason=\"length\"}} {}\n", finished_length_);
  o += fmt::format("tandem_requests_finished_total{{reason=\"cancelled\"}} {}\n", finished_cancelled_);
  o += fmt::format("tandem_requests_finished_total{{reason=\"error\"}} {}\n", finished_error_);
  gauge("tandem_queue_length", "Requests waiting to be scheduled.", (double)g_.waiting);
  gauge("tandem_running_sequences", "Sequences in the running batch.", (double)g_.running);
  gauge("tandem_kv_blocks_used", "KV cache blocks referenced by sequences.", (double)g_.kv_blocks_used);
  gauge("tandem_kv_blocks_free", "KV cache blocks free or holding evictable cached prefixes.", (double)g_.kv_blocks_free);
  gauge("tandem_kv_blocks_cached", "Free KV blocks that still hold a cached prefix.", (double)g_.kv_blocks_cached);
  gauge("tandem_kv_blocks_total", "KV cache blocks in the pool.", (double)g_.kv_blocks_total);
  counter("tandem_prompt_tokens_total", "Prompt tokens of admitted requests.", (double)g_.prompt_tokens);
  counter("tandem_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache.", (double)g_.cached_prompt_tokens);
  gauge("tandem_prefix_cache_hit_rate", "Cached prompt tokens / prompt tokens.",
        g_.prompt_tokens ? (double)g_.cached_prompt_tokens / g_.prompt_tokens : 0.0);
  counter("tandem_generated_tokens_total", "Tokens generated.", (double)g_.generated_tokens);
  counter("tandem_preemptions_total", "Sequences preempted (freed, recomputed later) for lack of KV blocks.", (double)g_.preemptions);
  counter("tandem_draft_tokens_total", "Tokens proposed by speculative decoding.", (double)g_.drafted_tokens);
  counter("tandem_draft_accepted_tokens_total", "Proposed tokens the model accepted.", (double)g_.accepted_tokens);
  gauge("tandem_draft_acceptance_rate", "Accepted / proposed tokens of speculative decoding.",
        g_.drafted_tokens ? (double)g_.accepted_tokens / g_.drafted_tokens : 0.0);
  counter("tandem_draft_model_passes_total", "Forward passes of the draft model (speculative mode draft).", (double)g_.draft_passes);
  counter("tandem_engine_steps_total", "Forward passes of the serving loop.", (double)g_.steps);
  gauge("tandem_generation_tokens_per_second", "Generated tokens per second, recent.", g_.tokens_per_s);
  return o;
}

}  // namespace tandem::server
