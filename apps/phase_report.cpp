#include "apps/phase_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tandem::apps {

double PhaseMeasure::roof_flops(const cpu::MachinePeaks& m) const {
  return std::min(m.flops_per_s, m.read_bytes_per_s * cost.intensity());
}

std::string PhaseMeasure::bound_by(const cpu::MachinePeaks& m) const {
  return cost.intensity() >= m.ridge() ? "compute" : "memory bandwidth";
}

std::string phase_table(const std::vector<PhaseMeasure>& phases, const cpu::MachinePeaks& m) {
  std::string o = fmt::format("{:<9} {:>7} {:>10} {:>9} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8}  {}\n", "phase", "tokens",
                              "time ms", "tok/s", "GFLOP", "MB read", "FLOP/B", "GFLOP/s", "GB/s", "%peak", "%BW",
                              "bound by");
  for (const PhaseMeasure& p : phases) {
    o += fmt::format("{:<9} {:>7} {:>10.2f} {:>9.1f} {:>10.3f} {:>10.1f} {:>9.2f} {:>9.2f} {:>8.2f} {:>7.1f}% {:>7.1f}%  {}\n", p.name,
                     p.tokens, p.seconds * 1e3, p.tok_s(), p.cost.flops / 1e9, p.cost.bytes() / 1e6, p.cost.intensity(),
                     p.flops_per_s() / 1e9, p.bytes_per_s() / 1e9, 100 * p.flops_per_s() / m.flops_per_s,
                     100 * p.bytes_per_s() / m.read_bytes_per_s, p.bound_by(m));
  }
  o += fmt::format(
      "machine: {:.1f} GFLOP/s peak (f32 FMA probe, {} threads, {}), {:.1f} GB/s read bandwidth (probe over {}); "
      "ridge point {:.1f} FLOP/byte\n",
      m.flops_per_s / 1e9, m.threads, cpu::isa_name(m.isa), m.read_bytes_per_s / 1e9, fmt::format("{} MiB", m.probe_bytes >> 20),
      m.ridge());
  return o;
}

nlohmann::ordered_json phase_json(const PhaseMeasure& p, const cpu::MachinePeaks& m) {
  return {{"tokens", p.tokens},
          {"seconds", p.seconds},
          {"tok_s", p.tok_s()},
          {"flops", p.cost.flops},
          {"weight_bytes", p.cost.weight_bytes},
          {"kv_read_bytes", p.cost.kv_read_bytes},
          {"kv_write_bytes", p.cost.kv_write_bytes},
          {"intensity_flop_per_byte", p.cost.intensity()},
          {"gflop_s", p.flops_per_s() / 1e9},
          {"gb_s", p.bytes_per_s() / 1e9},
          {"pct_peak_flops", 100 * p.flops_per_s() / m.flops_per_s},
          {"pct_read_bandwidth", 100 * p.bytes_per_s() / m.read_bytes_per_s},
          {"bound_by", p.bound_by(m)}};
}

nlohmann::ordered_json machine_json(const cpu::MachinePeaks& m) {
  return {{"threads", m.threads},
          {"isa", std::string(cpu::isa_name(m.isa))},
          {"peak_gflop_s", m.flops_per_s / 1e9},
          {"read_gb_s", m.read_bytes_per_s / 1e9},
          {"ridge_flop_per_byte", m.ridge()}};
}

}  // namespace tandem::apps
