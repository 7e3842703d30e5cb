// /metrics of disaggregated serving (engine/disaggregation.h): TTFT split into its queue,
// prefill and transfer parts, each request's KV transfer time, the KV bytes and blocks moved,
// and every role's busy seconds, blocks in use and whether it is up (each decode rank's as the
// router last heard it).
#include <fmt/format.h>

#include "server/metrics.h"

namespace tandem::server {

namespace {

void labelled(std::string& o, const char* name, const char* type, const char* help,
              const std::vector<std::pair<std::string, double>>& rows) {
  o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  for (const auto& [labels, v] : rows) o += fmt::format("{}{{{}}} {}\n", name, labels, v);
}

std::string role(const char* r, int rank) { return fmt::format("role=\"{}\",rank=\"{}\"", r, rank); }

}  // namespace

Metrics::Handoffs::Handoffs()
    : queue({0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      prefill({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      transfer({0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      stream({0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}) {}

void Metrics::observe_handoff(const HandoffTiming& t) {
  std::lock_guard<std::mutex> l(mu_);
  handoffs_.on = true;
  handoffs_.queue.observe(t.queue_s);
  handoffs_.prefill.observe(t.prefill_s);
  handoffs_.transfer.observe(t.transfer_s);
  handoffs_.stream.observe(t.stream_s);
}

void Metrics::set_router(const RouterStats& s, double decode_busy_s) {
  std::lock_guard<std::mutex> l(mu_);
  handoffs_.on = true;
  handoffs_.router = s;
  handoffs_.decode_busy_s = decode_busy_s;
}

void Metrics::render_disaggregation(std::string& o) const {
  if (!handoffs_.on) return;
  const Handoffs& h = handoffs_;
  o += h.queue.render("tandem_ttft_queue_seconds", "TTFT's wait: the router's queue and the prefill rank's, before its prefill ran.");
  o += h.prefill.render("tandem_ttft_prefill_seconds", "TTFT's prefill: the prompt's chunks on its prefill rank.");
  o += h.transfer.render("tandem_ttft_transfer_seconds",
                         "TTFT's transfer: from the prefill's end until its last KV block landed on the decode rank.");
  o += h.stream.render("tandem_kv_transfer_seconds",
                       "Each request's KV transfer, first block announced to last landed (overlapping its prefill).");
  const RouterStats& r = h.router;
  std::vector<std::pair<std::string, double>> busy, up, sent, sent_bytes, used, received, received_bytes, handoffs, decoding;
  for (const DecodeRankState& d : r.decoders) {
    busy.emplace_back(role("decode", d.rank), d.rank == 0 ? h.decode_busy_s : d.busy_s);
    up.emplace_back(role("decode", d.rank), d.up ? 1 : 0);
    received.emplace_back(role("decode", d.rank), (double)d.blocks_received);
    received_bytes.emplace_back(role("decode", d.rank), (double)d.bytes_received);
    handoffs.emplace_back(role("decode", d.rank), (double)d.handoffs);
    decoding.emplace_back(role("decode", d.rank), (double)d.requests);
    used.emplace_back(role("decode", d.rank), (double)d.used_blocks);
  }
  for (const PrefillRankState& p : r.ranks) {
    busy.emplace_back(role("prefill", p.rank), p.busy_s);
    up.emplace_back(role("prefill", p.rank), p.up ? 1 : 0);
    sent.emplace_back(role("prefill", p.rank), (double)p.blocks_sent);
    sent_bytes.emplace_back(role("prefill", p.rank), (double)p.bytes_sent);
    used.emplace_back(role("prefill", p.rank), (double)p.used_blocks);
  }
  labelled(o, "tandem_role_busy_seconds", "counter", "Seconds each role's rank spent in forward passes.", busy);
  labelled(o, "tandem_role_up", "gauge", "1 while the role's rank answers, 0 once it is down.", up);
  labelled(o, "tandem_kv_blocks_sent_total", "counter", "KV blocks each prefill rank sent to the decode ranks.", sent);
  labelled(o, "tandem_kv_bytes_sent_total", "counter", "KV bytes each prefill rank sent to the decode ranks.", sent_bytes);
  labelled(o, "tandem_role_kv_blocks_used", "gauge", "KV blocks each rank's sequences hold.", used);
  labelled(o, "tandem_kv_blocks_received_total", "counter", "KV blocks each decode rank received.", received);
  labelled(o, "tandem_kv_bytes_received_total", "counter", "KV bytes each decode rank received.", received_bytes);
  labelled(o, "tandem_kv_handoffs_total", "counter", "Requests handed from a prefill rank to each decode rank.", handoffs);
  labelled(o, "tandem_decode_rank_requests", "gauge", "Requests routed to each decode rank and not finished.", decoding);
  labelled(o, "tandem_handoff_failed_requests_total", "counter", "Requests failed because a rank they were on failed.",
           {{role("router", 0), (double)r.failed_requests}});
  labelled(o, "tandem_handoffs_in_flight", "gauge", "Requests whose prompt is routed to a prefill rank and not yet computed (and waiting for one).",
           {{"state=\"in_flight\"", (double)r.in_flight}, {"state=\"waiting\"", (double)r.waiting}});
}

}  // namespace tandem::server
