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

namespace {

struct KvArgs {
  std::string model, dtype = "f16", memory, weights, kv_memory;
  int layers = 0, kv_heads = 0, head_dim = 0, ranks = 1, block_tokens = 16;
  int64_t ctx = 0, batch = 1;
  bool json = false;
};

void add_kv_options(CLI::App* sub, KvArgs& a) {
  sub->add_option("-m,--model", a.model, "GGUF model (its shape and weight bytes)");
  sub->add_option("--layers", a.layers, "layers (without --model)");
  sub->add_option("--kv-heads", a.kv_heads, "KV heads (n_head without GQA)");
  sub->add_option("--head-dim", a.head_dim, "head dimension");
  sub->add_option("--ctx", a.ctx, "tokens per sequence (default: the model's training context, else 4096)");
  sub->add_option("--batch", a.batch, "sequences")->check(CLI::PositiveNumber);
  sub->add_option("--dtype", a.dtype, "K/V element type: f16, bf16, f32, q8_0, q4_0, ...");
  sub->add_option("--memory", a.memory, "memory budget for weights + KV, e.g. 24GiB; gpu: the GPU's free memory now");
  sub->add_option("--weights-bytes", a.weights, "weight bytes when no model is given, e.g. 140GB");
  sub->add_option("--tensor-parallel", a.ranks,
                  "ranks the model is split over: every figure is rank 0's (its K,V heads, the most of any rank; 1/N of "
                  "the weights; "
                  "--memory is each rank's)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--kv-memory", a.kv_memory,
                  "a KV block pool of this size (serve's --kv-memory): sequences of --ctx tokens it holds, full store and "
                  "window-only");
  sub->add_option("--block-tokens", a.block_tokens, "tokens per KV block (with --kv-memory)")->check(CLI::Range(1, 1024));
  sub->add_flag("--json", a.json, "print one JSON object");
}

// What the planner is given, and what the report names: the model (or "dimensions", and the
// rank), the layers' windows and the memory budget.
struct KvSetup {
  KvPlanInput in;
  std::string what = "dimensions";
  std::vector<int64_t> windows;  // per layer, from the model's ArchSpec (0: global)
  std::string budget;            // --memory as the report names it
};

// The shape from -m (with its training context and weight bytes) or from the bare dimensions;
// the options given override the model's.
Status read_shape(const KvArgs& a, KvSetup& s) {
  KvPlanInput& in = s.in;
  if (!a.model.empty()) {
    auto f = GgufFile::open(a.model);
    if (!f.ok()) return f.error();
    auto c = ModelConfig::from_gguf(*f.value());
    if (!c.ok()) return c.error();
    in.n_layer = c->n_layer;
    in.n_kv_head = c->n_kv_head;
    in.head_dim = c->head_dim;
    in.ctx = c->n_ctx_train > 0 ? c->n_ctx_train : 4096;
    in.weights_bytes = f.value()->tensor_bytes();
    s.what = c->name.empty() ? a.model : c->name;
    if (c->spec.max_window() > 0)
      for (const LayerSpec& l : c->spec.layers) s.windows.push_back(l.window);
  } else if (a.layers <= 0 || a.kv_heads <= 0 || a.head_dim <= 0) {
    return make_error("give -m MODEL, or --layers, --kv-heads and --head-dim");
  }
  if (a.layers > 0) in.n_layer = a.layers;
  if (a.kv_heads > 0) in.n_kv_head = a.kv_heads;
  if (a.head_dim > 0) in.head_dim = a.head_dim;
  if (a.ctx > 0) in.ctx = a.ctx;
  in.batch = a.batch;
  if (!a.weights.empty()) {
    auto w = parse_bytes(a.weights);
    if (!w.ok()) return w.error();
    in.weights_bytes = w.value();
  }
  return Status::Ok();
}

// Tensor parallel: rank 0 holds the most K,V heads (model/tensor_parallel.h divides them,
// the first ranks one more when uneven, or replicates one per rank when n_kv_head < N),
// and about 1/N of the weights.
Status take_rank_share(const KvArgs& a, KvSetup& s) {
  KvPlanInput& in = s.in;
  const int all_kv_heads = in.n_kv_head;
  if (a.ranks <= 1) return Status::Ok();
  auto share = kv_head_share(in.n_kv_head, 0, a.ranks);
  if (!share.ok()) return make_error("--tensor-parallel {}: {}", a.ranks, share.error().message);
  in.n_kv_head = share->count;
  in.weights_bytes /= (uint64_t)a.ranks;
  s.what += fmt::format(", rank 0 of {} ({} of its {} K,V heads{}{})", a.ranks, in.n_kv_head, all_kv_heads,
                        share->replicated ? ", replicated" : "",
                        all_kv_heads % a.ranks && !share->replicated ? ": the most any rank holds" : "");
  return Status::Ok();
}

// The element type, and the memory budget: a size, or the GPU's free memory now.
Status read_budget(const KvArgs& a, KvSetup& s) {
  auto dt = dtype_from_name(a.dtype);
  if (!dt.ok()) return dt.error();
  s.in.dtype = dt.value();
  s.budget = a.memory;
  if (a.memory == "gpu") {  // what a model loaded onto the GPU now would share with its KV pool
    auto gpu = probe_gpu();
    if (!gpu.ok()) return make_error("--memory gpu: {}", gpu.error().message);
    s.in.memory_bytes = gpu->memory_free;
    s.budget = fmt::format("{}'s free memory ({} of {})", gpu->name, format_bytes((double)gpu->memory_free),
                           format_bytes((double)gpu->memory_total));
  } else if (!a.memory.empty()) {
    auto m = parse_bytes(a.memory);
    if (!m.ok()) return m.error();
    s.in.memory_bytes = m.value();
  }
  return Status::Ok();
}

// A pool of --kv-memory bytes, as serve builds it (planned = allocated): blocks, blocks per
// sequence of ctx tokens (per layer group), sequences.
struct PoolFit {
  KvLayerGroups groups;
  uint64_t block_bytes = 0;
  int64_t blocks = 0, blocks_per_sequence = 0, sequences = 0;
};

// The plan, and what a sequence is allocated beside it.
struct KvReport {
  KvPlan p;
  bool window_only = false;
  uint64_t allocated_seq = 0;
  int64_t max_sequences = 0;
  uint64_t kv_memory = 0;
  std::vector<PoolFit> fits;  // full store, then window-only when it differs
};

// Sliding-window layers only ever read their last `window` positions, and tandem's pool
// (the CPU backend's default; not with --swa-full, not on CUDA yet) keeps, in blocks of a
// group of layers, only the window's blocks and one more: that is what a sequence is
// allocated, so it leads. The seed's formula (every layer, every position) is the full store.
void allocate_sequences(const KvArgs& a, const KvSetup& s, KvReport& r) {
  const KvPlanInput& in = s.in;
  const std::vector<int64_t>& windows = s.windows;
  r.window_only = !windows.empty() && a.ranks == 1 &&
                  KvLayerGroups::plan(in.n_layer, windows, /*keep_full=*/false).n_groups() > 1;
  r.allocated_seq = r.p.bytes_per_sequence;
  if (r.window_only) {
    const BlockPoolShape bs{in.n_layer, in.n_kv_head, in.head_dim, a.block_tokens, 0, in.dtype, windows, false};
    r.allocated_seq = (uint64_t)KvLayerGroups::plan(in.n_layer, windows, false).blocks_per_sequence(in.ctx, a.block_tokens) *
                      BlockPool::block_bytes_of(bs);
  }
  r.max_sequences = r.p.max_sequences;
  if (in.memory_bytes && r.allocated_seq)
    r.max_sequences =
        (int64_t)((in.memory_bytes > in.weights_bytes ? in.memory_bytes - in.weights_bytes : 0) / r.allocated_seq);
}

Status fit_kv_memory(const KvArgs& a, const KvSetup& s, KvReport& r) {
  if (a.kv_memory.empty()) return Status::Ok();
  const KvPlanInput& in = s.in;
  auto km = parse_bytes(a.kv_memory);
  if (!km.ok()) return km.error();
  r.kv_memory = km.value();
  for (bool keep_full : {true, false}) {
    BlockPoolShape bs{in.n_layer, in.n_kv_head, in.head_dim, a.block_tokens, 0, in.dtype, s.windows, keep_full};
    PoolFit f;
    f.groups = KvLayerGroups::plan(in.n_layer, s.windows, keep_full);
    if (!keep_full && (f.groups.n_groups() == 1 || a.ranks > 1)) break;  // tensor parallel: full store
    f.block_bytes = BlockPool::block_bytes_of(bs);
    f.blocks = BlockPool::blocks_for_bytes(bs, r.kv_memory);
    f.blocks_per_sequence = f.groups.blocks_per_sequence(in.ctx, a.block_tokens);
    f.sequences = f.blocks_per_sequence ? f.blocks / f.blocks_per_sequence : 0;
    r.fits.push_back(f);
  }
  return Status::Ok();
}

void print_kv_json(const KvArgs& a, const KvSetup& s, const KvReport& r) {
  const KvPlanInput& in = s.in;
  const KvPlan& p = r.p;
  nlohmann::ordered_json j = {{"model", s.what},
                              {"layers", in.n_layer},
                              {"kv_heads", in.n_kv_head},
                              {"tensor_parallel", a.ranks},
                              {"head_dim", in.head_dim},
                              {"ctx", in.ctx},
                              {"batch", in.batch},
                              {"dtype", std::string(dtype_name(in.dtype))},
                              {"bytes_per_element", p.bytes_per_element},
                              {"kv_bytes_per_token", p.bytes_per_token},
                              {"kv_bytes_per_sequence", r.allocated_seq},
                              {"kv_bytes_per_sequence_full_store", p.bytes_per_sequence},
                              {"kv_bytes_batch", r.allocated_seq * (uint64_t)in.batch},
                              {"weights_bytes", in.weights_bytes}};
  if (!s.windows.empty()) {
    j["windowed_layers"] = std::count_if(s.windows.begin(), s.windows.end(), [](int64_t w) { return w > 0; });
    j["window"] = *std::max_element(s.windows.begin(), s.windows.end());
    j["window_only"] = r.window_only;
  }
  if (r.kv_memory) {
    j["kv_memory_bytes"] = r.kv_memory;
    j["block_tokens"] = a.block_tokens;
    for (const PoolFit& f : r.fits)
      j[f.groups.n_groups() > 1 ? "window_only" : "full_store"] = {
          {"layer_groups", f.groups.n_groups()},       {"layers_per_block", f.groups.group_layers},
          {"block_bytes", f.block_bytes},              {"blocks", f.blocks},
          {"blocks_per_sequence", f.blocks_per_sequence}, {"kv_bytes_per_sequence", f.blocks_per_sequence * f.block_bytes},
          {"sequences", f.sequences}};
  }
  if (in.memory_bytes) {
    j["memory_bytes"] = in.memory_bytes;
    j["max_sequences"] = r.max_sequences;
    j["max_kv_tokens"] = p.max_tokens;
  }
  fmt::print("{}\n", j.dump(2));
}

// The text report's first lines: the formula, then bytes per token, sequence and batch.
void print_kv_bytes(const KvSetup& s, const KvReport& r) {
  const KvPlanInput& in = s.in;
  const KvPlan& p = r.p;
  const std::vector<int64_t>& windows = s.windows;
  fmt::print("KV cache of {}: 2 x {} layers x {} kv heads x {} head dim x {} bytes ({})\n", s.what, in.n_layer, in.n_kv_head,
             in.head_dim, p.bytes_per_element, dtype_name(in.dtype));
  fmt::print("  per token      {:>14} bytes  {}\n", p.bytes_per_token, format_bytes((double)p.bytes_per_token));
  if (r.window_only) {
    const auto n_win = std::count_if(windows.begin(), windows.end(), [](int64_t w) { return w > 0; });
    fmt::print("  per sequence   {:>14} bytes  {}   ({} tokens; {} of {} layers keep only their last {} positions: the\n"
               "                 blocks tandem's pool allocates, window-only, on the CPU backend)\n",
               r.allocated_seq, format_bytes((double)r.allocated_seq), in.ctx, n_win, in.n_layer,
               *std::max_element(windows.begin(), windows.end()));
    fmt::print("  full store     {:>14} bytes  {}   (every layer keeps every position, {:.1f}x more: --swa-full, and\n"
               "                 the CUDA backend for now)\n",
               p.bytes_per_sequence, format_bytes((double)p.bytes_per_sequence),
               r.allocated_seq ? (double)p.bytes_per_sequence / (double)r.allocated_seq : 0.0);
  } else {
    fmt::print("  per sequence   {:>14} bytes  {}   ({} tokens)\n", p.bytes_per_sequence, format_bytes((double)p.bytes_per_sequence),
               in.ctx);
  }
  fmt::print("  batch          {:>14} bytes  {}   ({} sequences)\n", r.allocated_seq * (uint64_t)in.batch,
             format_bytes((double)(r.allocated_seq * (uint64_t)in.batch)), in.batch);
}

// The text report's last lines: what --kv-memory holds, the weights, and what fits in --memory.
void print_kv_fits(const KvArgs& a, const KvSetup& s, const KvReport& r) {
  const KvPlanInput& in = s.in;
  for (const PoolFit& f : r.fits) {
    const bool win = f.groups.n_groups() > 1;
    fmt::print("--kv-memory {} ({}), {}: blocks of {} tokens x {} layers ({} bytes), {} blocks; a sequence of {} tokens "
               "holds {} blocks ({}{}): {} sequences fit\n",
               a.kv_memory, format_bytes((double)r.kv_memory), win ? "window-only" : "full store", a.block_tokens,
               f.groups.group_layers, f.block_bytes, f.blocks, in.ctx, f.blocks_per_sequence,
               format_bytes((double)(f.blocks_per_sequence * f.block_bytes)),
               win ? fmt::format("; {} window groups keep {} blocks each", f.groups.n_window_groups(),
                                 std::min(f.groups.blocks_per_sequence(in.ctx, a.block_tokens),
                                          (f.groups.window.back() + a.block_tokens - 1) / a.block_tokens + 1))
                   : "",
               f.sequences);
  }
  if (in.weights_bytes)
    fmt::print("weights          {:>14} bytes  {}   (KV of one sequence is {:.1f}% of it)\n", in.weights_bytes,
               format_bytes((double)in.weights_bytes), 100.0 * (double)r.allocated_seq / (double)in.weights_bytes);
  if (in.memory_bytes && in.memory_bytes <= in.weights_bytes) {
    fmt::print("in {} ({}): the weights alone ({}) do not fit; no room for a KV cache\n", s.budget,
               format_bytes((double)in.memory_bytes), format_bytes((double)in.weights_bytes));
  } else if (in.memory_bytes) {
    fmt::print("in {} ({}): weights leave {}; {} sequences of {} tokens fit{}\n", s.budget, format_bytes((double)in.memory_bytes),
               format_bytes((double)(in.memory_bytes > in.weights_bytes ? in.memory_bytes - in.weights_bytes : 0)),
               r.max_sequences, in.ctx,
               r.window_only ? " (window-only)" : fmt::format(" ({} KV tokens in all)", r.p.max_tokens));
  }
}

// The planner's input from the options, in the order their errors are reported.
Status set_up(const KvArgs& a, KvSetup& s) {
  TANDEM_TRY(read_shape(a, s));
  TANDEM_TRY(take_rank_share(a, s));
  return read_budget(a, s);
}

int run_kv(const KvArgs& a) {
  KvSetup s;
  if (Status st = set_up(a, s); !st.ok()) return fail(st.error().message);
  auto plan = plan_kv(s.in);
  if (!plan.ok()) return fail(plan.error().message);
  KvReport r;
  r.p = plan.value();
  allocate_sequences(a, s, r);
  if (Status st = fit_kv_memory(a, s, r); !st.ok()) return fail(st.error().message);
  if (a.json) {
    print_kv_json(a, s, r);
    return 0;
  }
  print_kv_bytes(s, r);
  print_kv_fits(a, s, r);
  return 0;
}

}  // namespace

Command add_kv_command(CLI::App& app) {
  return subcommand(app, "kv", "KV cache memory planner: bytes per token/sequence/batch, and what fits", add_kv_options, run_kv);
}

}  // namespace tandem::apps
