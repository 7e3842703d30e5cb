// The llama.cpp peer, driven through its public C API (llama.h) to record what tandem is checked
// against: greedy continuations as token ids, with the peer's own top-1 margin at every step, and
// the logits of every position of a token list. Built by record_peer_greedy.py against the peer
// that bench/compare.py builds; not part of tandem.
//
//   peer_greedy MODEL (--prompt TEXT | --ids "1 2 3") [-n 64] [-t threads] [--logits OUT.f32] [--f32-kv]
//
// Prints one JSON object: {"prompt_ids": [...], "ids": [...], "margins": [...], "n_vocab": V}.
// With --logits the ids are decoded as one batch with every position's logits written, [T, V]
// float32, and nothing is generated.
#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

int fail(const char* what) {
  std::fprintf(stderr, "peer_greedy: %s\n", what);
  return 1;
}

void print_ids(const char* key, const std::vector<llama_token>& v, bool last) {
  std::printf("\"%s\": [", key);
  for (size_t i = 0; i < v.size(); i++) std::printf("%s%d", i ? ", " : "", v[i]);
  std::printf("]%s", last ? "" : ", ");
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, prompt, ids_text, logits_out;
  bool have_prompt = false, have_ids = false, f32_kv = false;
  int n_gen = 64, threads = 2;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--prompt") prompt = next(), have_prompt = true;
    else if (a == "--ids") ids_text = next(), have_ids = true;
    else if (a == "-n") n_gen = std::atoi(next());
    else if (a == "-t") threads = std::atoi(next());
    else if (a == "--logits") logits_out = next();
    else if (a == "--f32-kv") f32_kv = true;
    else if (model_path.empty()) model_path = a;
    else return fail("unexpected argument");
  }
  if (model_path.empty() || have_prompt == have_ids) return fail("usage: MODEL (--prompt TEXT | --ids \"1 2\") [-n N] [-t T] [--logits F]");

  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) return fail("cannot load the model");
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  std::vector<llama_token> prompt_ids;
  if (have_prompt) {
    const int n = -llama_tokenize(vocab, prompt.c_str(), (int)prompt.size(), nullptr, 0, true, true);
    prompt_ids.resize(n);
    if (llama_tokenize(vocab, prompt.c_str(), (int)prompt.size(), prompt_ids.data(), n, true, true) < 0)
      return fail("tokenize failed");
  } else {
    std::istringstream in(ids_text);
    for (llama_token t; in >> t;) prompt_ids.push_back(t);
  }
  if (prompt_ids.empty()) return fail("empty prompt");

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = (uint32_t)(prompt_ids.size() + n_gen + 8);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.no_perf = true;
  if (f32_kv) {  // for comparing logits with a float64 reference: no f16 rounding of K and V
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  }
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return fail("cannot make a context");

  if (!logits_out.empty()) {
    const int T = (int)prompt_ids.size();
    llama_batch b = llama_batch_init(T, 0, 1);
    for (int i = 0; i < T; i++) {
      b.token[i] = prompt_ids[i];
      b.pos[i] = i;
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = 1;
    }
    b.n_tokens = T;
    if (llama_decode(ctx, b) != 0) return fail("decode failed");
    FILE* f = std::fopen(logits_out.c_str(), "wb");
    if (!f) return fail("cannot write the logits");
    for (int i = 0; i < T; i++) std::fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, f);
    std::fclose(f);
    llama_batch_free(b);
    std::printf("{\"n_vocab\": %d, \"positions\": %d}\n", n_vocab, T);
  } else {
    std::vector<llama_token> out;
    std::vector<float> margins;
    std::vector<llama_token> feed = prompt_ids;
    for (int step = 0; step < n_gen; step++) {
      if (llama_decode(ctx, llama_batch_get_one(feed.data(), (int32_t)feed.size())) != 0) return fail("decode failed");
      const float* l = llama_get_logits_ith(ctx, -1);
      const int best = (int)(std::max_element(l, l + n_vocab) - l);
      float second = -1e30f;
      for (int v = 0; v < n_vocab; v++)
        if (v != best) second = std::max(second, l[v]);
      out.push_back(best);
      margins.push_back(l[best] - second);
      feed.assign(1, best);  // greedy, and no stop at end-of-generation: the ids are the check
    }
    std::printf("{");
    print_ids("prompt_ids", prompt_ids, false);
    print_ids("ids", out, false);
    std::printf("\"margins\": [");
    for (size_t i = 0; i < margins.size(); i++) std::printf("%s%.4f", i ? ", " : "", margins[i]);
    std::printf("], \"n_vocab\": %d}\n", n_vocab);
  }
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
