// `tandem bench --sweep DIR`: measures TTFT over prompt lengths, TPOT over context lengths and
// total generation time with and without the KV cache, and writes them as SVG plots with a
// roofline chart placing both phases.
#pragma once

#include <string>

#include "apps/phase_report.h"
#include "core/error.h"
#include "model/model.h"

namespace tandem::apps {

struct SweepOptions {
  std::string dir;
  int64_t max_context = 4096;
  int64_t max_naive = 128;
  DType kv_dtype = DType::F16;
};

// pp and tg are the bench's own phase measures, placed on the roofline chart.
Status run_sweep(Model& m, const SweepOptions& o, const cpu::MachinePeaks& peaks, const PhaseMeasure& pp,
                 const PhaseMeasure& tg);

}  // namespace tandem::apps
