#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

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

Metrics::Counters::Counters()
    : ttft({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}), tpot({0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1}) {}

Metrics::Metrics() = default;

Metrics::Counters* Metrics::tenant_locked(const std::string& tenant) {
  return tenant.empty() ? nullptr : &tenants_[tenant];
}

void Metrics::request_started(const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  for (Counters* c : {&all_, tenant_locked(tenant)})
    if (c) c->started++;
}
void Metrics::request_rejected(const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  for (Counters* c : {&all_, tenant_locked(tenant)})
    if (c) c->rejected++;
}
void Metrics::request_finished(const std::string& reason, const std::string& tenant, int64_t prompt_tokens,
                               int64_t cached_tokens, int64_t generated_tokens) {
  std::lock_guard<std::mutex> l(mu_);
  for (Counters* c : {&all_, tenant_locked(tenant)}) {
    if (!c) continue;
    if (reason == "stop") c->finished_stop++;
    else if (reason == "length") c->finished_length++;
    else if (reason == "cancelled") c->finished_cancelled++;
    else c->finished_error++;
    c->prompt_tokens += (uint64_t)std::max<int64_t>(0, prompt_tokens);
    c->cached_prompt_tokens += (uint64_t)std::max<int64_t>(0, cached_tokens);
    c->generated_tokens += (uint64_t)std::max<int64_t>(0, generated_tokens);
  }
}
void Metrics::observe_ttft(double s, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  for (Counters* c : {&all_, tenant_locked(tenant)})
    if (c) c->ttft.observe(s);
}
void Metrics::observe_tpot(double s, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  for (Counters* c : {&all_, tenant_locked(tenant)})
    if (c) c->tpot.observe(s);
}
void Metrics::set_gauges(const Gauges& g) {
  std::lock_guard<std::mutex> l(mu_);
  g_ = g;
}

namespace {
void gauge(std::string& o, const char* name, const char* help, double v) {
  o += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
}
void counter(std::string& o, const char* name, const char* help, double v) {
  o += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
}
}  // namespace

std::string Metrics::render_counters(const Counters& c) const {
  std::string o;
  o += c.ttft.render("tandem_time_to_first_token_seconds", "Time from request arrival to its first token.");
  o += c.tpot.render("tandem_time_per_output_token_seconds", "Time between consecutive output tokens of a request.");
  counter(o, "tandem_requests_started_total", "Requests accepted by the engine.", (double)c.started);
  counter(o, "tandem_requests_rejected_total", "Requests refused with a 4xx before reaching the engine.", (double)c.rejected);
  o += "# HELP tandem_requests_finished_total Requests finished, by reason.\n# TYPE tandem_requests_finished_total counter\n";
  o += fmt::format("tandem_requests_finished_total{{reason=\"stop\"}} {}\n", c.finished_stop);
  o += fmt::format("tandem_requests_finished_total{{reason=\"length\"}} {}\n", c.finished_length);
  o += fmt::format("tandem_requests_finished_total{{reason=\"cancelled\"}} {}\n", c.finished_cancelled);
  o += fmt::format("tandem_requests_finished_total{{reason=\"error\"}} {}\n", c.finished_error);
  return o;
}

std::string Metrics::render_tenant(const std::string& tenant) const {
  std::lock_guard<std::mutex> l(mu_);
  static const Counters none;
  const auto it = tenants_.find(tenant);
  const Counters& c = it == tenants_.end() ? none : it->second;
  std::string o = "# tandem: this API key's own requests (the server-wide view needs an operator key)\n";
  o += render_counters(c);
  counter(o, "tandem_prompt_tokens_total", "Prompt tokens of this key's finished requests.", (double)c.prompt_tokens);
  counter(o, "tandem_prompt_tokens_cached_total", "Of those, tokens served from the prefix cache.", (double)c.cached_prompt_tokens);
  gauge(o, "tandem_prefix_cache_hit_rate", "Cached prompt tokens / prompt tokens.",
        c.prompt_tokens ? (double)c.cached_prompt_tokens / (double)c.prompt_tokens : 0.0);
  counter(o, "tandem_generated_tokens_total", "Tokens generated for this key's finished requests.", (double)c.generated_tokens);
  return o;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string o = render_counters(all_);
  gauge(o, "tandem_queue_length", "Requests waiting to be scheduled.", (double)g_.waiting);
  gauge(o, "tandem_running_sequences", "Sequences in the running batch.", (double)g_.running);
  gauge(o, "tandem_kv_blocks_used", "KV cache blocks referenced by sequences.", (double)g_.kv_blocks_used);
  gauge(o, "tandem_kv_blocks_free", "KV cache blocks free or holding evictable cached prefixes.", (double)g_.kv_blocks_free);
  gauge(o, "tandem_kv_blocks_cached", "Free KV blocks that still hold a cached prefix.", (double)g_.kv_blocks_cached);
  gauge(o, "tandem_kv_blocks_total", "KV cache blocks in the pool.", (double)g_.kv_blocks_total);
  counter(o, "tandem_prompt_tokens_total", "Prompt tokens of admitted requests.", (double)g_.prompt_tokens);
  counter(o, "tandem_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache.", (double)g_.cached_prompt_tokens);
  gauge(o, "tandem_prefix_cache_hit_rate", "Cached prompt tokens / prompt tokens.",
        g_.prompt_tokens ? (double)g_.cached_prompt_tokens / (double)g_.prompt_tokens : 0.0);
  counter(o, "tandem_generated_tokens_total", "Tokens generated.", (double)g_.generated_tokens);
  counter(o, "tandem_preemptions_total", "Sequences preempted (freed, recomputed later) for lack of KV blocks.", (double)g_.preemptions);
  counter(o, "tandem_draft_tokens_total", "Tokens proposed by speculative decoding.", (double)g_.drafted_tokens);
  counter(o, "tandem_draft_accepted_tokens_total", "Proposed tokens the model accepted.", (double)g_.accepted_tokens);
  gauge(o, "tandem_draft_acceptance_rate", "Accepted / proposed tokens of speculative decoding.",
        g_.drafted_tokens ? (double)g_.accepted_tokens / (double)g_.drafted_tokens : 0.0);
  counter(o, "tandem_draft_model_passes_total", "Forward passes of the draft model (speculative mode draft).", (double)g_.draft_passes);
  counter(o, "tandem_engine_steps_total", "Forward passes of the serving loop.", (double)g_.steps);
  gauge(o, "tandem_generation_tokens_per_second", "Generated tokens per second, recent.", g_.tokens_per_s);
  render_disaggregation(o);
  return o;
}

}  // namespace tandem::server
