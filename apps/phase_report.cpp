#include "apps/phase_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/make_backend.h"

namespace tandem::apps {

bool runs_int8_products(const Model& m) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(&m.backend());
  if (!cpu || !cpu->quantized_activations()) return false;
  const CpuBackend& be = *cpu;
  uint64_t int8 = 0, all = 0;
  auto count = [&](const Weight& w) {
    all += w.bytes;
    if (be.kernels().quant_dot(w.type)) int8 += w.bytes;
  };
  for (const auto& l : m.weights().layers)
    for (const Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) count(*w);
  count(m.weights().output);
  return 2 * int8 > all;
}

double PhaseMeasure::roof_flops(const cpu::MachinePeaks& m) const {
  return std::min(compute_roof(m), m.read_bytes_per_s * cost.intensity());
}

std::string PhaseMeasure::bound_by(const cpu::MachinePeaks& m) const {
  return cost.intensity() >= m.ridge(int8) ? "compute" : "memory bandwidth";
}

std::string phase_table(const std::vector<PhaseMeasure>& phases, const cpu::MachinePeaks& m) {
  std::string o = fmt::format("{:<9} {:>7} {:>10} {:>9} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8}  {:<9} {}\n", "phase",
                              "tokens", "time ms", "tok/s", "GFLOP", "MB read", "FLOP/B", "GFLOP/s", "GB/s", "%peak", "%BW",
                              "peak of", "bound by");
  auto row = [&](const PhaseMeasure& p, const char* indent) {
    o += fmt::format("{:<9} {:>7} {:>10.2f} {:>9.1f} {:>10.3f} {:>10.1f} {:>9.2f} {:>9.2f} {:>8.2f} {:>7.1f}% {:>7.1f}%  {:<9} {}\n",
                     indent + p.name, p.tokens, p.seconds * 1e3, p.tok_s(), p.cost.flops / 1e9, p.cost.bytes() / 1e6,
                     p.cost.intensity(), p.flops_per_s() / 1e9, p.bytes_per_s() / 1e9,
                     100 * p.flops_per_s() / p.compute_roof(m), 100 * p.bytes_per_s() / m.read_bytes_per_s, p.roof_name(),
                     p.bound_by(m));
  };
  for (const PhaseMeasure& p : phases) {
    row(p, "");
    if (!p.splits()) continue;
    row(p.products_part(), " ");
    row(p.attention_part(), " ");
  }
  o += machine_line(m) + "\n";
  return o;
}

std::string attention_lines(const PhaseMeasure& p, const cpu::MachinePeaks& m) {
  std::string o;
  for (const PhaseMeasure& part : {p.products_part(), p.attention_part()})
    o += fmt::format("{} {:<10} {:>8.2f} ms ({:>4.1f}%): {:>8.3f} GFLOP {:>8.2f} GFLOP/s = {:>5.1f}% of {}; {:>8.1f} MB at "
                     "{:>6.2f} GB/s = {:>5.1f}% of read\n",
                     p.name, part.name, part.seconds * 1e3, p.seconds > 0 ? 100 * part.seconds / p.seconds : 0.0,
                     part.cost.flops / 1e9, part.flops_per_s() / 1e9, 100 * part.flops_per_s() / part.compute_roof(m),
                     part.roof_name(), part.cost.bytes() / 1e6, part.bytes_per_s() / 1e9,
                     100 * part.bytes_per_s() / m.read_bytes_per_s);
  return o;
}

std::string machine_line(const cpu::MachinePeaks& m) {
  if (m.int8_ops_per_s == 0)  // a GPU: its tensor-core GEMM and HBM read probes
    return fmt::format("machine ({}): {:.1f} TFLOP/s tensor cores (cuBLAS F16 probe), {:.1f} GB/s read; ridge {:.1f} FLOP/byte",
                       m.label, m.flops_per_s / 1e12, m.read_bytes_per_s / 1e9, m.ridge(false));
  const std::string raised =
      m.raised_from > 0 ? fmt::format(", raised from the probes' {:.1f}: decode read faster than they did", m.raised_from / 1e9)
                        : "";
  return fmt::format(
      "machine ({}): {:.1f} GFLOP/s f32 FMA, {:.1f} Gop/s int8 dot, {:.1f} GB/s read (best of the probes "
      "over {} MiB, decode's working set; median {:.1f}, least {:.1f}{}); ridge {:.1f} FLOP/byte (f32), {:.1f} (int8)",
      m.label, m.flops_per_s / 1e9, m.int8_ops_per_s / 1e9, m.read_bytes_per_s / 1e9, m.probe_bytes >> 20,
      m.read_median / 1e9, m.read_min / 1e9, raised, m.ridge(false), m.ridge(true));
}

Result<cpu::MachinePeaks> measure_roofs(const Model& m, double working_set_bytes) {
  if (const auto* be = dynamic_cast<const CpuBackend*>(&m.backend()))
    return cpu::measure_machine(be->isa(), be->threads(), cpu::probe_bytes_for(working_set_bytes));
  auto gpu = probe_gpu();
  if (!gpu.ok()) return gpu.error();
  auto r = measure_gpu_roofs();
  if (!r.ok()) return r.error();
  cpu::MachinePeaks p;
  p.read_bytes_per_s = p.read_median = p.read_min = r->read_gb_s * 1e9;
  p.flops_per_s = r->tensor_tflops * 1e12;
  p.label = gpu->name;
  return p;
}

nlohmann::ordered_json phase_json(const PhaseMeasure& p, const cpu::MachinePeaks& m) {
  nlohmann::ordered_json j = phase_figures(p, m);
  if (p.splits()) j["products"] = phase_figures(p.products_part(), m), j["attention"] = phase_figures(p.attention_part(), m);
  return j;
}

nlohmann::ordered_json phase_figures(const PhaseMeasure& p, const cpu::MachinePeaks& m) {
  return {{"tokens", p.tokens},
          {"seconds", p.seconds},
          {"tok_s", p.tok_s()},
          {"flops", p.cost.flops},
          {"attention_flops", p.cost.attn_flops},
          {"weight_bytes", p.cost.weight_bytes},
          {"kv_read_bytes", p.cost.kv_read_bytes},
          {"kv_write_bytes", p.cost.kv_write_bytes},
          {"intensity_flop_per_byte", p.cost.intensity()},
          {"gflop_s", p.flops_per_s() / 1e9},
          {"gb_s", p.bytes_per_s() / 1e9},
          {"pct_peak_flops", 100 * p.flops_per_s() / p.compute_roof(m)},
          {"compute_roof", p.roof_name()},
          {"pct_read_bandwidth", 100 * p.bytes_per_s() / m.read_bytes_per_s},
          {"bound_by", p.bound_by(m)}};
}

nlohmann::ordered_json machine_json(const cpu::MachinePeaks& m) {
  return {{"threads", m.threads},
          {"isa", std::string(cpu::isa_name(m.isa))},
          {"peak_gflop_s", m.flops_per_s / 1e9},
          {"peak_int8_gop_s", m.int8_ops_per_s / 1e9},
          {"read_gb_s", m.read_bytes_per_s / 1e9},
          {"read_gb_s_median", m.read_median / 1e9},
          {"read_gb_s_least", m.read_min / 1e9},
          {"read_roof_raised_from_gb_s", m.raised_from / 1e9},
          {"ridge_flop_per_byte", m.ridge(false)},
          {"ridge_int8_op_per_byte", m.ridge(true)}};
}

}  // namespace tandem::apps
