// `tandem kv`: the KV memory planner. From a model file or from bare dimensions: KV bytes per
// token, per sequence and per batch by the seed's formula, the weights' bytes, and how many
// sequences of a given length fit in a memory budget.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "apps/commands.h"
#include "apps/common.h"
#include "backend/make_backend.h"
#include "core/units.h"
#include "gguf/gguf_file.h"
#include "kv/block_pool.h"
#include "kv/kv_planner.h"
#include "kv/layer_groups.h"
#include "model/model_config.h"
#include "model/tensor_parallel.h"

namespace tandem::apps {

Command add_kv_command(CLI::App& app) {
  struct Args {
    std::string model, dtype = "f16", memory, weights, kv_memory;
    int layers = 0, kv_heads = 0, head_dim = 0, ranks = 1, block_tokens = 16;
    int64_t ctx = 0, batch = 1;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("kv", "KV cache memory planner: bytes per token/sequence/batch, and what fits");
  sub->add_option("-m,--model", a->model, "GGUF model (its shape and weight bytes)");
  sub->add_option("--layers", a->layers, "layers (without --model)");
  sub->add_option("--kv-heads", a->kv_heads, "KV heads (n_head without GQA)");
  sub->add_option("--head-dim", a->head_dim, "head dimension");
  sub->add_option("--ctx", a->ctx, "tokens per sequence (default: the model's training context, else 4096)");
  sub->add_option("--batch", a->batch, "sequences")->check(CLI::PositiveNumber);
  sub->add_option("--dtype", a->dtype, "K/V element type: f16, bf16, f32, q8_0, q4_0, ...");
  sub->add_option("--memory", a->memory, "memory budget for weights + KV, e.g. 24GiB; gpu: the GPU's free memory now");
  sub->add_option("--weights-bytes", a->weights, "weight bytes when no model is given, e.g. 140GB");
  sub->add_option("--tensor-parallel", a->ranks,
                  "ranks the model is split over: every figure is rank 0's (its K,V heads, the most of any rank; 1/N of "
                  "the weights; "
                  "--memory is each rank's)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--kv-memory", a->kv_memory,
                  "a KV block pool of this size (serve's --kv-memory): sequences of --ctx tokens it holds, full store and "
                  "window-only");
  sub->add_option("--block-tokens", a->block_tokens, "tokens per KV block (with --kv-memory)")->check(CLI::Range(1, 1024));
  sub->add_flag("--json", a->json, "print one JSON object");
  return [a]() -> int {
    KvPlanInput in;
    std::string what = "dimensions";
    std::vector<int64_t> windows;  // per layer, from the model's ArchSpec (0: global)
    if (!a->model.empty()) {
      auto f = GgufFile::open(a->model);
      if (!f.ok()) return fail(f.error().message);
      auto c = ModelConfig::from_gguf(*f.value());
      if (!c.ok()) return fail(c.error().message);
      in.n_layer = c->n_layer;
      in.n_kv_head = c->n_kv_head;
      in.head_dim = c->head_dim;
      in.ctx = c->n_ctx_train > 0 ? c->n_ctx_train : 4096;
      in.weights_bytes = f.value()->tensor_bytes();
      what = c->name.empty() ? a->model : c->name;
      if (c->spec.max_window() > 0)
        for (const LayerSpec& l : c->spec.layers) windows.push_back(l.window);
    } else if (a->layers <= 0 || a->kv_heads <= 0 || a->head_dim <= 0) {
      return fail("give -m MODEL, or --layers, --kv-heads and --head-dim");
    }
    if (a->layers > 0) in.n_layer = a->layers;
    if (a->kv_heads > 0) in.n_kv_head = a->kv_heads;
    if (a->head_dim > 0) in.head_dim = a->head_dim;
    if (a->ctx > 0) in.ctx = a->ctx;
    in.batch = a->batch;
    if (!a->weights.empty()) {
      auto w = parse_bytes(a->weights);
      if (!w.ok()) return fail(w.error().message);
      in.weights_bytes = w.value();
    }
    // Tensor parallel: rank 0 holds the most K,V heads (model/tensor_parallel.h divides them,
    // the first ranks one more when uneven, or replicates one per rank when n_kv_head < N),
    // and about 1/N of the weights.
    const int all_kv_heads = in.n_kv_head;
    if (a->ranks > 1) {
      auto share = kv_head_share(in.n_kv_head, 0, a->ranks);
      if (!share.ok()) return fail(fmt::format("--tensor-parallel {}: {}", a->ranks, share.error().message));
      in.n_kv_head = share->count;
      in.weights_bytes /= (uint64_t)a->ranks;
      what += fmt::format(", rank 0 of {} ({} of its {} K,V heads{}{})", a->ranks, in.n_kv_head, all_kv_heads,
                          share->replicated ? ", replicated" : "",
                          all_kv_heads % a->ranks && !share->replicated ? ": the most any rank holds" : "");
    }
    auto dt = dtype_from_name(a->dtype);
    if (!dt.ok()) return fail(dt.error().message);
    in.dtype = dt.value();
    std::string budget = a->memory;
    if (a->memory == "gpu") {  // what a model loaded onto the GPU now would share with its KV pool
      auto gpu = probe_gpu();
      if (!gpu.ok()) return fail(fmt::format("--memory gpu: {}", gpu.error().message));
      in.memory_bytes = gpu->memory_free;
      budget = fmt::format("{}'s free memory ({} of {})", gpu->name, format_bytes((double)gpu->memory_free),
                           format_bytes((double)gpu->memory_total));
    } else if (!a->memory.empty()) {
      auto m = parse_bytes(a->memory);
      if (!m.ok()) return fail(m.error().message);
      in.memory_bytes = m.value();
    }
    auto plan = plan_kv(in);
    if (!plan.ok()) return fail(plan.error().message);
    const KvPlan& p = plan.value();
    const std::string dname(dtype_name(in.dtype));
    // Sliding-window layers only ever read their last `window` positions, and tandem's pool
    // (the CPU backend's default; not with --swa-full, not on CUDA yet) keeps, in blocks of a
    // group of layers, only the window's blocks and one more: that is what a sequence is
    // allocated, so it leads. The seed's formula (every layer, every position) is the full store.
    const bool window_only = !windows.empty() && a->ranks == 1 &&
                             KvLayerGroups::plan(in.n_layer, windows, /*keep_full=*/false).n_groups() > 1;
    uint64_t allocated_seq = p.bytes_per_sequence;
    if (window_only) {
      const BlockPoolShape s{in.n_layer, in.n_kv_head, in.head_dim, a->block_tokens, 0, in.dtype, windows, false};
      allocated_seq = (uint64_t)KvLayerGroups::plan(in.n_layer, windows, false).blocks_per_sequence(in.ctx, a->block_tokens) *
                      BlockPool::block_bytes_of(s);
    }
    int64_t max_sequences = p.max_sequences;
    if (in.memory_bytes && allocated_seq)
      max_sequences = (int64_t)((in.memory_bytes > in.weights_bytes ? in.memory_bytes - in.weights_bytes : 0) / allocated_seq);
    // A pool of --kv-memory bytes, as serve builds it (planned = allocated): blocks, blocks per
    // sequence of ctx tokens (per layer group), sequences.
    struct PoolFit {
      KvLayerGroups groups;
      uint64_t block_bytes = 0;
      int64_t blocks = 0, blocks_per_sequence = 0, sequences = 0;
    };
    std::vector<PoolFit> fits;  // full store, then window-only when it differs
    uint64_t kv_memory = 0;
    if (!a->kv_memory.empty()) {
      auto km = parse_bytes(a->kv_memory);
      if (!km.ok()) return fail(km.error().message);
      kv_memory = km.value();
      for (bool keep_full : {true, false}) {
        BlockPoolShape s{in.n_layer, in.n_kv_head, in.head_dim, a->block_tokens, 0, in.dtype, windows, keep_full};
        PoolFit f;
        f.groups = KvLayerGroups::plan(in.n_layer, windows, keep_full);
        if (!keep_full && (f.groups.n_groups() == 1 || a->ranks > 1)) break;  // tensor parallel: full store
        f.block_bytes = BlockPool::block_bytes_of(s);
        f.blocks = BlockPool::blocks_for_bytes(s, kv_memory);
        f.blocks_per_sequence = f.groups.blocks_per_sequence(in.ctx, a->block_tokens);
        f.sequences = f.blocks_per_sequence ? f.blocks / f.blocks_per_sequence : 0;
        fits.push_back(f);
      }
    }
    if (a->json) {
      nlohmann::ordered_json j = {{"model", what},
                                  {"layers", in.n_layer},
                                  {"kv_heads", in.n_kv_head},
                                  {"tensor_parallel", a->ranks},
                                  {"head_dim", in.head_dim},
                                  {"ctx", in.ctx},
                                  {"batch", in.batch},
                                  {"dtype", dname},
                                  {"bytes_per_element", p.bytes_per_element},
                                  {"kv_bytes_per_token", p.bytes_per_token},
                                  {"kv_bytes_per_sequence", allocated_seq},
                                  {"kv_bytes_per_sequence_full_store", p.bytes_per_sequence},
                                  {"kv_bytes_batch", allocated_seq * (uint64_t)in.batch},
                                  {"weights_bytes", in.weights_bytes}};
      if (!windows.empty()) {
        j["windowed_layers"] = std::count_if(windows.begin(), windows.end(), [](int64_t w) { return w > 0; });
        j["window"] = *std::max_element(windows.begin(), windows.end());
        j["window_only"] = window_only;
      }
      if (kv_memory) {
        j["kv_memory_bytes"] = kv_memory;
        j["block_tokens"] = a->block_tokens;
        for (const PoolFit& f : fits)
          j[f.groups.n_groups() > 1 ? "window_only" : "full_store"] = {
              {"layer_groups", f.groups.n_groups()},       {"layers_per_block", f.groups.group_layers},
              {"block_bytes", f.block_bytes},              {"blocks", f.blocks},
              {"blocks_per_sequence", f.blocks_per_sequence}, {"kv_bytes_per_sequence", f.blocks_per_sequence * f.block_bytes},
              {"sequences", f.sequences}};
      }
      if (in.memory_bytes) {
        j["memory_bytes"] = in.memory_bytes;
        j["max_sequences"] = max_sequences;
        j["max_kv_tokens"] = p.max_tokens;
      }
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("KV cache of {}: 2 x {} layers x {} kv heads x {} head dim x {} bytes ({})\n", what, in.n_layer, in.n_kv_head,
               in.head_dim, p.bytes_per_element, dname);
    fmt::print("  per token      {:>14} bytes  {}\n", p.bytes_per_token, format_bytes((double)p.bytes_per_token));
    if (window_only) {
      const auto n_win = std::count_if(windows.begin(), windows.end(), [](int64_t w) { return w > 0; });
      fmt::print("  per sequence   {:>14} bytes  {}   ({} tokens; {} of {} layers keep only their last {} positions: the\n"
                 "                 blocks tandem's pool allocates, window-only, on the CPU backend)\n",
                 allocated_seq, format_bytes((double)allocated_seq), in.ctx, n_win, in.n_layer,
                 *std::max_element(windows.begin(), windows.end()));
      fmt::print("  full store     {:>14} bytes  {}   (every layer keeps every position, {:.1f}x more: --swa-full, and\n"
                 "                 the CUDA backend for now)\n",
                 p.bytes_per_sequence, format_bytes((double)p.bytes_per_sequence),
                 allocated_seq ? (double)p.bytes_per_sequence / (double)allocated_seq : 0.0);
    } else {
      fmt::print("  per sequence   {:>14} bytes  {}   ({} tokens)\n", p.bytes_per_sequence, format_bytes((double)p.bytes_per_sequence),
                 in.ctx);
    }
    fmt::print("  batch          {:>14} bytes  {}   ({} sequences)\n", allocated_seq * (uint64_t)in.batch,
               format_bytes((double)(allocated_seq * (uint64_t)in.batch)), in.batch);
    for (const PoolFit& f : fits) {
      const bool win = f.groups.n_groups() > 1;
      fmt::print("--kv-memory {} ({}), {}: blocks of {} tokens x {} layers ({} bytes), {} blocks; a sequence of {} tokens "
                 "holds {} blocks ({}{}): {} sequences fit\n",
                 a->kv_memory, format_bytes((double)kv_memory), win ? "window-only" : "full store", a->block_tokens,
                 f.groups.group_layers, f.block_bytes, f.blocks, in.ctx, f.blocks_per_sequence,
                 format_bytes((double)(f.blocks_per_sequence * f.block_bytes)),
                 win ? fmt::format("; {} window groups keep {} blocks each", f.groups.n_window_groups(),
                                   std::min(f.groups.blocks_per_sequence(in.ctx, a->block_tokens),
                                            (f.groups.window.back() + a->block_tokens - 1) / a->block_tokens + 1))
                     : "",
                 f.sequences);
    }
    if (in.weights_bytes)
      fmt::print("weights          {:>14} bytes  {}   (KV of one sequence is {:.1f}% of it)\n", in.weights_bytes,
                 format_bytes((double)in.weights_bytes), 100.0 * (double)allocated_seq / (double)in.weights_bytes);
    if (in.memory_bytes && in.memory_bytes <= in.weights_bytes) {
      fmt::print("in {} ({}): the weights alone ({}) do not fit; no room for a KV cache\n", budget,
                 format_bytes((double)in.memory_bytes), format_bytes((double)in.weights_bytes));
    } else if (in.memory_bytes) {
      fmt::print("in {} ({}): weights leave {}; {} sequences of {} tokens fit{}\n", budget, format_bytes((double)in.memory_bytes),
                 format_bytes((double)(in.memory_bytes > in.weights_bytes ? in.memory_bytes - in.weights_bytes : 0)),
                 max_sequences, in.ctx,
                 window_only ? " (window-only)" : fmt::format(" ({} KV tokens in all)", p.max_tokens));
    }
    return 0;
  };
}

}  // namespace tandem::apps
