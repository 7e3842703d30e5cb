#include "model/tensor_parallel.h"

#include <algorithm>

namespace tandem {

TensorParallelPlan TensorParallelPlan::whole(const ModelConfig& c) {
  TensorParallelPlan p;
  p.n_q_head = c.n_head;
  p.n_kv_head = c.n_kv_head;
  p.n_ff = c.n_ff;
  p.n_vocab = c.n_vocab;
  return p;
}

Result<TensorParallelPlan> TensorParallelPlan::make(const ModelConfig& c, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) return make_error("tensor parallel: rank {} of {}", rank, size);
  if (size == 1) return whole(c);
  const auto cannot = [&](const std::string& why) {
    return make_error("tensor parallel: {} ({}) cannot be split {} ways: {}", c.name.empty() ? c.arch : c.name, c.arch,
                      size, why);
  };
  if (c.n_head % size != 0) return cannot(fmt::format("its {} query heads are not a multiple of {}", c.n_head, size));
  if (c.n_kv_head % size != 0 && size % c.n_kv_head != 0)
    return cannot(fmt::format("its {} K,V heads neither divide into {} parts nor replicate evenly over {} ranks",
                              c.n_kv_head, size, size));
  if (c.n_ff % size != 0) return cannot(fmt::format("its feed-forward width {} is not a multiple of {}", c.n_ff, size));
  if (c.n_vocab % size != 0) return cannot(fmt::format("its vocabulary of {} is not a multiple of {}", c.n_vocab, size));
  TensorParallelPlan p;
  p.rank = rank;
  p.size = size;
  p.n_q_head = c.n_head / size;
  p.q_head0 = rank * p.n_q_head;
  if (c.n_kv_head >= size) {
    p.n_kv_head = c.n_kv_head / size;
    p.kv_head0 = rank * p.n_kv_head;
  } else {  // every query head of this rank reads the one K,V head of its group
    p.kv_replicated = true;
    p.n_kv_head = 1;
    p.kv_head0 = p.q_head0 / c.gqa_group();
  }
  p.n_ff = c.n_ff / size;
  p.ff0 = rank * p.n_ff;
  p.n_vocab = c.n_vocab / size;
  p.vocab0 = rank * p.n_vocab;
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
  return ranks > 1 ? 2.0 * (ranks - 1) / ranks * all_reduce_bytes + gather_bytes * (ranks - 1) / ranks : 0.0;
}

CommunicationCost communication_cost(const ModelConfig& c, int ranks, int64_t n_tokens, int64_t n_logits) {
  CommunicationCost k;
  if (ranks <= 1) return k;
  const double row = (double)c.n_embd * sizeof(float);
  k.all_reduces = 2 * (int64_t)c.n_layer + 1;  // attn_output and ffn_down per layer, the embedding
  k.per_layer_bytes = 2 * row * (double)n_tokens;
  k.all_reduce_bytes = (double)k.all_reduces * row * (double)n_tokens;
  k.gather_bytes = (double)n_logits * c.n_vocab * sizeof(float);
  return k;
}

}  // namespace tandem
