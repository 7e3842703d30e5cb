// Per-phase roofline figures shared by `tandem explain` and `tandem bench`: FLOPs, bytes,
// arithmetic intensity, achieved GFLOP/s and GB/s, and their fraction of this machine's
// measured roofs.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/phase_cost.h"
#include "kernels/cpu/probe.h"
#include "model/model.h"

namespace tandem::apps {

struct PhaseMeasure {
  std::string name;  // "prefill", "decode", "pp512", ...
  int64_t tokens = 0;
  double seconds = 0;
  PhaseCost cost;
  bool int8 = false;  // its products run 8-bit dot products (8-bit activations, quantized weights)
  double attention_s = -1;  // of `seconds`, the time in attention (-1: not measured)

  // Its weight products and its attention as phases of their own, with the time each took
  // (the products: the rest of the time), when the attention time was measured. Attention
  // runs f32 FMAs (K and V widened from the cache's type), whatever the products run.
  bool splits() const { return attention_s >= 0 && cost.attn_flops > 0; }
  PhaseMeasure products_part() const { return {"products", tokens, seconds - attention_s, cost.products(), int8}; }
  PhaseMeasure attention_part() const { return {"attention", tokens, attention_s, cost.attention(), false}; }

  double tok_s() const { return seconds > 0 ? tokens / seconds : 0; }
  double flops_per_s() const { return seconds > 0 ? cost.flops / seconds : 0; }
  double bytes_per_s() const { return seconds > 0 ? cost.bytes() / seconds : 0; }
  // The compute roof of the instructions it runs, and that roof's name.
  double compute_roof(const cpu::MachinePeaks& m) const { return m.compute_roof(int8); }
  const char* roof_name() const { return int8 ? "int8 dot" : "f32 FMA"; }
  // The roof at this intensity: min(compute roof, bandwidth x intensity).
  double roof_flops(const cpu::MachinePeaks& m) const;
  // "compute" when the intensity is past the ridge point, else "memory bandwidth".
  std::string bound_by(const cpu::MachinePeaks& m) const;
};

// A fixed-width table of the phases, and the machine's roofs under it.
std::string phase_table(const std::vector<PhaseMeasure>& phases, const cpu::MachinePeaks& m);
// Two lines for a phase that splits: its weight products' and its attention's time, FLOPs,
// bytes, and the % of the roof each runs under (attention: f32 FMA, and the read bandwidth).
std::string attention_lines(const PhaseMeasure& p, const cpu::MachinePeaks& m);
// The machine's roofs in one line: both compute roofs, the read roof and its probes' spread.
std::string machine_line(const cpu::MachinePeaks& m);
// The roofs of the machine the model runs on: the CPU's probes, or the GPU's (HBM read,
// tensor-core GEMM) when its backend is the GPU.
// working_set_bytes: what decode reads per token, the read probe's size.
Result<cpu::MachinePeaks> measure_roofs(const Model& m, double working_set_bytes);
// True when the model's products run 8-bit dot products: 8-bit activations, and most of its
// weight bytes of a type with such a kernel.
bool runs_int8_products(const Model& m);
// A phase's figures, and (when it splits) its products' and attention's under those keys.
nlohmann::ordered_json phase_json(const PhaseMeasure& p, const cpu::MachinePeaks& m);
nlohmann::ordered_json phase_figures(const PhaseMeasure& p, const cpu::MachinePeaks& m);
nlohmann::ordered_json machine_json(const cpu::MachinePeaks& m);

}  // namespace tandem::apps
