#include "model/param_count.h"

namespace tandem {

ParamCount count_params(const GgufFile& f) {
  ParamCount p;
  for (const auto& t : f.tensors()) {
    p.total += t.n_elements();
    p.total_bytes += t.nbytes;
    if (t.name.find("_exps.") != std::string::npos) {  // llama.cpp's names for the routed experts
      p.experts += t.n_elements();
      p.expert_bytes += t.nbytes;
    }
  }
  if (f.find_tensor("output.weight"))
    if (const GgufTensor* e = f.find_tensor("token_embd.weight")) p.lookup_bytes = e->nbytes;
  return p;
}

}  // namespace tandem
