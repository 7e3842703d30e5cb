#include "apps/serve_disaggregated.h"

#include <cmath>

#include <fmt/core.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/mpi/mpi_collectives.h"
#include "engine/decode_role.h"
#include "engine/prefill_role.h"

namespace tandem::apps {

Result<DisaggregationOptions> disaggregation_options(const DisaggregateArgs& a, int ranks) {
  if (a.tensor_parallel > 1)
    return make_error("--disaggregate with --tensor-parallel {}: each disaggregated rank holds the whole model; splitting a "
                      "role over several ranks may come later", a.tensor_parallel);
  if (a.draft_model)
    return make_error("--disaggregate with --draft-model: the draft model would need its own K,V of each prompt on the "
                      "decode rank (not yet); prompt lookup (--speculative lookup) works");
  if (!(a.rank_timeout > 0) || !std::isfinite(a.rank_timeout))
    return make_error("--disaggregate with --rank-timeout {}: give the seconds a rank may stay silent, more than 0", a.rank_timeout);
  if (ranks < 2)
    return make_error("--disaggregate {}: this process is not an MPI job of several ranks; start it as mpirun -np N tandem "
                      "serve ... --disaggregate P:D (P + D = N){}", a.spec, mpi_built() ? "" : " with tandem built with MPI");
  const DisaggregateSplit split = parse_disaggregate(a.spec, ranks);
  if (!split.error.empty()) return make_error("{}", split.error);
  DisaggregationOptions o;
  o.n_prefill = split.n_prefill;
  o.n_decode = split.n_decode;
  o.peer_timeout_s = a.rank_timeout;
  return o;
}

Result<DisaggregationOptions> disaggregation_options(const DisaggregateArgs& a) {
  const std::shared_ptr<Collectives> world = mpi_world();
  return disaggregation_options(a, world ? world->size() : 1);
}

Status check_disaggregated_backend(const Model& model) {
  if (!dynamic_cast<const CpuBackend*>(&model.backend()))
    return make_error("--disaggregate runs CPU ranks (their KV in host memory, sent over MPI); GPU ranks over NCCL are "
                      "not built yet: use --device cpu");
  return Status::Ok();
}

int run_role_rank(Model& model, BlockPool& pool, PeerLink& link, const SchedulerOptions& so, const DisaggregationOptions& o) {
  const bool prefill = link.rank() <= o.n_prefill;
  fmt::print(stderr, "tandem serve: rank {} {} ({} prefill rank{} 1..{}, {} decode rank{}: 0{}; rank 0 routes)\n", link.rank(),
             prefill ? "prefills" : "decodes", o.n_prefill, o.n_prefill == 1 ? "" : "s", o.n_prefill, o.n_decode,
             o.n_decode == 1 ? "" : "s",
             o.n_decode == 1 ? "" : o.n_decode == 2 ? fmt::format(", {}", o.n_prefill + 1)
                                                    : fmt::format(", {}..{}", o.n_prefill + 1, o.n_prefill + o.n_decode - 1));
  std::fflush(stderr);
  Status st = Status::Ok();
  if (prefill) {
    PrefillRole role(model, pool, link, so, o);
    st = role.run();
  } else {
    DecodeRole role(model, pool, link, so, o);
    st = role.run();
  }
  if (st.ok()) return 0;
  fmt::print(stderr, "tandem serve: {}\n", st.error().message);
  std::fflush(stderr);
  std::_Exit(1);  // the router is gone: MPI_Finalize would wait for it
}

}  // namespace tandem::apps
