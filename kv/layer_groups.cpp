#include "kv/layer_groups.h"

#include <algorithm>

namespace tandem {

KvLayerGroups KvLayerGroups::plan(int n_layer, std::span<const int64_t> layer_windows, bool keep_full) {
  KvLayerGroups g;
  std::vector<int> full, windowed;
  int64_t window = 0;
  for (int l = 0; l < n_layer; l++) {
    const int64_t w = (size_t)l < layer_windows.size() ? layer_windows[(size_t)l] : 0;
    (w > 0 ? windowed : full).push_back(l);
    window = std::max(window, w);  // several windows: every window layer keeps the widest
  }
  g.group_of.assign((size_t)n_layer, 0);
  g.slot_of.assign((size_t)n_layer, 0);
  if (keep_full || full.empty() || windowed.empty()) {
    g.group_layers = n_layer;
    g.window = {0};
    for (int l = 0; l < n_layer; l++) g.slot_of[(size_t)l] = l;
    return g;
  }
  // Groups as large as the smaller class: no padding for Gemma 3 (3 + 15 layers of 270M), at
  // most one group's worth otherwise (1B: 4 full layers, 22 windowed in 6 groups of 4).
  g.group_layers = (int)std::min(full.size(), windowed.size());
  auto assign = [&](const std::vector<int>& layers, int64_t w) {
    for (size_t i = 0; i < layers.size(); i++) {
      if (i % (size_t)g.group_layers == 0) g.window.push_back(w);
      g.group_of[(size_t)layers[i]] = g.n_groups() - 1;
      g.slot_of[(size_t)layers[i]] = (int)(i % (size_t)g.group_layers);
    }
  };
  assign(full, 0);
  assign(windowed, window);
  return g;
}

int KvLayerGroups::n_window_groups() const {
  return (int)std::count_if(window.begin(), window.end(), [](int64_t w) { return w > 0; });
}

int64_t KvLayerGroups::blocks_per_sequence(int64_t ctx, int block_tokens, int64_t chunk) const {
  const int64_t B = block_tokens, all = (ctx + B - 1) / B;
  int64_t n = 0;
  for (int64_t w : window) n += w > 0 ? std::min(all, (w - 1 + chunk + B - 1) / B + 1) : all;
  return n;
}

}  // namespace tandem
