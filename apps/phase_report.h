// Per-phase roofline figures shared by `tandem explain` and `tandem bench`: FLOPs, bytes,
// arithmetic intensity, achieved GFLOP/s and GB/s, and their fraction of this machine's
// measured roofs.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/phase_cost.h"
#include "kernels/cpu/probe.h"

namespace tandem::apps {

struct PhaseMeasure {
  std::string name;  // "prefill", "decode", "pp512", ...
  int64_t tokens = 0;
  double seconds = 0;
  PhaseCost cost;

  double tok_s() const { return seconds > 0 ? tokens / seconds : 0; }
  double flops_per_s() const { return seconds > 0 ? cost.flops / seconds : 0; }
  double bytes_per_s() const { return seconds > 0 ? cost.bytes() / seconds : 0; }
  // The roof at this intensity: min(peak FLOP/s, bandwidth x intensity).
  double roof_flops(const cpu::MachinePeaks& m) const;
  // "compute" when the intensity is past the ridge point, else "memory bandwidth".
  std::string bound_by(const cpu::MachinePeaks& m) const;
};

// A fixed-width table of the phases, and the machine's roofs under it.
std::string phase_table(const std::vector<PhaseMeasure>& phases, const cpu::MachinePeaks& m);
nlohmann::ordered_json phase_json(const PhaseMeasure& p, const cpu::MachinePeaks& m);
nlohmann::ordered_json machine_json(const cpu::MachinePeaks& m);

}  // namespace tandem::apps
