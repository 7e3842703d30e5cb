#include "model/tensor_parallel.h"

#include <algorithm>

namespace tandem {

namespace {

// n split into `parts` contiguous runs of whole units, the first ones a unit longer when they
// do not divide evenly; the last run also takes the n % unit left over. Empty when n has
// fewer units than parts.
std::vector<int64_t> shares(int64_t n, int64_t unit, int parts) {
  const int64_t units = n / unit;
  if (units < parts) return {};
  std::vector<int64_t> s((size_t)parts);
  for (int i = 0; i < parts; i++) s[(size_t)i] = (units / parts + (i < units % parts ? 1 : 0)) * unit;
  s.back() += n % unit;
  return s;
}

int64_t offset_of(const std::vector<int64_t>& s, int rank) {
  int64_t at = 0;
  for (int i = 0; i < rank; i++) at += s[(size_t)i];
  return at;
}

}  // namespace

TensorParallelPlan TensorParallelPlan::whole(const ModelConfig& c) {
  TensorParallelPlan p;
  p.n_q_head = c.n_head;
  p.n_kv_head = c.n_kv_head;
  p.n_ff = c.n_ff;
  p.n_embd = c.n_embd;
  p.n_vocab = c.n_vocab;
  p.q_cols = {(int64_t)c.n_head * c.head_dim};
  p.ff_cols = {c.n_ff};
  p.embd_cols = {c.n_embd};
  p.vocab_cols = {c.n_vocab};
  return p;
}

Result<KvHeadShare> kv_head_share(int n_kv_head, int rank, int size) {
  if (n_kv_head < 1 || size < 1 || rank < 0 || rank >= size)
    return make_error("no K,V heads for rank {} of {} from {} heads", rank, size, n_kv_head);
  if (n_kv_head >= size) {  // whole heads each, the first ranks one more when uneven
    const std::vector<int64_t> s = shares(n_kv_head, 1, size);
    return KvHeadShare{(int)offset_of(s, rank), (int)s[(size_t)rank], false};
  }
  if (size % n_kv_head != 0)
    return make_error("its {} K,V heads are fewer than {} ranks and do not replicate evenly over them ({} is not a "
                      "multiple of {})",
                      n_kv_head, size, size, n_kv_head);
  return KvHeadShare{rank / (size / n_kv_head), 1, true};
}

Result<TensorParallelPlan> TensorParallelPlan::make(const ModelConfig& c, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) return make_error("tensor parallel: rank {} of {}", rank, size);
  if (size == 1) return whole(c);
  const auto cannot = [&](const std::string& why) {
    return make_error("tensor parallel: {} ({}) cannot be split {} ways: {}", c.name.empty() ? c.arch : c.name, c.arch,
                      size, why);
  };
  if (c.spec.moe.active())  // each expert's FFN width could be split like a dense FFN's: not yet
    return cannot(fmt::format("its layers are mixtures of {} experts of width {}, which tensor parallelism does not split yet",
                              c.spec.moe.routing.n_expert, c.spec.moe.n_ff));
  TensorParallelPlan p;
  p.rank = rank;
  p.size = size;
  // Query heads follow their K,V head: a rank's run of them reads only its K,V heads.
  const int group = c.gqa_group();
  p.q_cols.resize((size_t)size);
  for (int r = 0; r < size; r++) {
    auto kv = kv_head_share(c.n_kv_head, r, size);
    if (!kv.ok()) return cannot(kv.error().message);
    int q0 = kv->first * group, nq = kv->count * group;
    if (kv->replicated) {  // the head's group of query heads shared by the size / n_kv_head ranks holding it
      const int holders = size / c.n_kv_head;
      const std::vector<int64_t> s = shares(group, 1, holders);
      if (s.empty())
        return cannot(fmt::format("each of its {} K,V heads would be shared by {} ranks, but has only {} query heads",
                                  c.n_kv_head, holders, group));
      q0 += (int)offset_of(s, r % holders);
      nq = (int)s[(size_t)(r % holders)];
    }
    p.q_cols[(size_t)r] = (int64_t)nq * c.head_dim;
    if (r != rank) continue;
    p.q_head0 = q0, p.n_q_head = nq;
    p.kv_head0 = kv->first, p.n_kv_head = kv->count, p.kv_replicated = kv->replicated;
  }
  const auto rows = [&](int64_t n, const char* what, std::vector<int64_t>& s, int64_t& first,
                        int64_t& count) -> Status {
    s = shares(n, kTensorParallelRows, size);
    if (s.empty())
      return cannot(fmt::format("its {} of {} is fewer than {} groups of {} rows", what, n, size, kTensorParallelRows));
    first = offset_of(s, rank), count = s[(size_t)rank];
    return Status::Ok();
  };
  TANDEM_TRY(rows(c.n_ff, "feed-forward width", p.ff_cols, p.ff0, p.n_ff));
  TANDEM_TRY(rows(c.n_embd, "embedding width", p.embd_cols, p.embd0, p.n_embd));
  TANDEM_TRY(rows(c.n_vocab, "vocabulary", p.vocab_cols, p.vocab0, p.n_vocab));
  return p;
}

namespace {

struct Header {
  int64_t op, pool_id, n_blocks, block_tokens, kv_dtype, n_dropped, n_tokens, n_seq, max_blocks;
};

}  // namespace

void send_step(Collectives& c, int64_t op, int64_t pool_id, const KvStore& kv,
               const std::vector<int64_t>& dropped_pools, const ForwardBatch* b) {
  Header h{op, pool_id, kv.n_blocks, kv.block_tokens, (int64_t)kv.dtype, (int64_t)dropped_pools.size(),
           b ? b->n_tokens() : 0, b ? b->n_seq() : 0, b ? b->max_blocks() : 0};
  c.broadcast(&h, sizeof h, 0);
  // tokens, positions, sequence ids, logit flags, tables, dropped pools: one int64 array.
  std::vector<int64_t> body;
  body.reserve((size_t)(4 * h.n_tokens + h.n_seq * h.max_blocks + h.n_dropped));
  if (b) {
    std::vector<int64_t> wants((size_t)h.n_tokens, 0);
    for (int64_t r : b->logit_rows()) wants[(size_t)r] = 1;
    for (int64_t i = 0; i < h.n_tokens; i++)
      body.insert(body.end(), {(int64_t)b->tokens()[(size_t)i], b->positions()[(size_t)i],
                               (int64_t)b->seq_ids()[(size_t)i], wants[(size_t)i]});
    for (int s = 0; s < h.n_seq; s++)
      for (int32_t blk : b->block_table(s)) body.push_back(blk);
  }
  body.insert(body.end(), dropped_pools.begin(), dropped_pools.end());
  if (!body.empty()) c.broadcast(body.data(), body.size() * sizeof(int64_t), 0);
}

Result<TensorParallelStep> receive_step(Collectives& c) {
  Header h{};
  c.broadcast(&h, sizeof h, 0);
  if (c.failed()) return make_error("{} (rank 0 sends a step or a heartbeat every {:.0f} s)", c.error(), kHeartbeatS);
  TensorParallelStep s;
  s.op = h.op;
  s.pool_id = h.pool_id;
  s.n_blocks = h.n_blocks;
  s.block_tokens = (int)h.block_tokens;
  s.kv_dtype = (DType)h.kv_dtype;
  std::vector<int64_t> body((size_t)(4 * h.n_tokens + h.n_seq * h.max_blocks + h.n_dropped));
  if (!body.empty()) c.broadcast(body.data(), body.size() * sizeof(int64_t), 0);
  if (c.failed()) return make_error("{}", c.error());
  const int64_t* p = body.data();
  const int64_t* tables = p + 4 * h.n_tokens;
  s.dropped_pools.assign(tables + h.n_seq * h.max_blocks, tables + h.n_seq * h.max_blocks + h.n_dropped);
  if (h.op != TensorParallelStep::Forward) return s;
  s.batch = std::make_unique<ForwardBatch>((int)h.block_tokens);
  for (int64_t q = 0; q < h.n_seq; q++) {
    const int64_t* row = tables + q * h.max_blocks;
    int64_t len = h.max_blocks;
    while (len > 0 && row[len - 1] < 0) len--;  // the -1 padding of the flat table
    std::vector<int32_t> table(row, row + len);
    s.batch->add_table(table);
  }
  for (int64_t i = 0; i < h.n_tokens; i++, p += 4)
    TANDEM_TRY(s.batch->add_token((int)p[2], (int32_t)p[0], p[1], p[3] != 0));
  return s;
}

double CommunicationCost::wire_bytes_per_rank(int ranks) const {
  return ranks > 1 ? gathered_bytes + 2.0 * (ranks - 1) / ranks * all_reduce_bytes : 0.0;
}

CommunicationCost communication_cost(const ModelConfig& c, const TensorParallelPlan& p, int64_t n_tokens,
                                     int64_t n_logits) {
  CommunicationCost k;
  if (!p.split()) return k;
  const auto others = [&](const std::vector<int64_t>& s) {  // floats of the other ranks' shares
    int64_t all = 0;
    for (int64_t v : s) all += v;
    return (double)(all - s[(size_t)p.rank]) * sizeof(float);
  };
  const double n = (double)n_tokens;
  k.collectives = 4 * (int64_t)c.n_layer + 2;
  k.per_layer_bytes = n * (others(p.q_cols) + others(p.ff_cols) + 2 * others(p.embd_cols));
  k.logits_bytes = (double)n_logits * others(p.vocab_cols);
  k.gathered_bytes = (double)c.n_layer * k.per_layer_bytes + k.logits_bytes;
  k.all_reduce_bytes = n * (double)c.n_embd * sizeof(float);
  return k;
}

}  // namespace tandem
