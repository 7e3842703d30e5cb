// Which layers a KV block holds. A full store keeps every position of every layer, so one block
// holds all layers. Sliding-window layers (Gemma 3: 5 of every 6, window 512) only ever read
// their last `window` positions, so their positions can go back to the pool once every window
// of the sequence has passed them, while full-attention layers keep all. Each class of layers
// is cut into groups of equal size; a block holds the K,V of one group's layers, and a sequence
// has one block table per group (vLLM's hybrid allocator does the same). All groups draw from
// one pool of equal-sized blocks, so memory moves freely between them.
//
// Group 0 is always a full-attention group: its table is the sequence's whole prefix, and the
// prefix cache's chain runs through it (the other groups' blocks are cached beside it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

struct KvLayerGroups {
  int group_layers = 0;          // layers one block holds
  std::vector<int64_t> window;   // [n_groups] 0: full attention, else the group's sliding window
  std::vector<int> group_of;     // [n_layer] the layer's group
  std::vector<int> slot_of;      // [n_layer] its place among its group's layers (0 .. group_layers - 1)

  // layer_windows: per layer, > 0 a sliding window, 0 full attention. With no window layer, or
  // no full-attention layer (group 0 must keep the whole prefix), or keep_full (llama.cpp's
  // --swa-full): one group of every layer, the full store.
  static KvLayerGroups plan(int n_layer, std::span<const int64_t> layer_windows, bool keep_full = false);

  int n_groups() const { return (int)window.size(); }
  bool windowed() const { return n_groups() > 1 && window.back() > 0; }
  int n_window_groups() const;
  // The first position group g must still hold when the sequence's next query is at `next`:
  // a query at p reads keys [p - window + 1, p].
  int64_t first_kept(int g, int64_t next) const {
    const int64_t w = window[(size_t)g];
    return w > 0 && next >= w ? next - w + 1 : 0;
  }
  // The most blocks of block_tokens positions one sequence of `ctx` positions holds at once,
  // computing `chunk` positions a pass (decoding: 1). A window group holds the window before a
  // chunk and the chunk (decoding: the window's blocks and one more), a full group all.
  int64_t blocks_per_sequence(int64_t ctx, int block_tokens, int64_t chunk = 1) const;
};

}  // namespace tandem
