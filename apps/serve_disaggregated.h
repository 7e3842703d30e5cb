// `tandem serve --disaggregate P:D` (engine/disaggregation.h): the checks before any rank loads
// the model, and the loops of the ranks without HTTP: prefill ranks 1..P and decode ranks
// P+1..P+D-1 (rank 0 serves HTTP, routes and decodes through the serving loop).
#pragma once

#include <memory>
#include <string>

#include "backend/peer_link.h"
#include "core/error.h"
#include "engine/disaggregation.h"
#include "engine/scheduler.h"

namespace tandem::apps {

struct DisaggregateArgs {
  std::string spec;          // --disaggregate P:D ("" = colocated)
  double rank_timeout = 5;   // --rank-timeout
  int tensor_parallel = 0;   // --tensor-parallel (refused beside it)
  bool draft_model = false;  // --draft-model given (refused beside it)
};

// The options for a job of `n_ranks` ranks, or an error a user can act on (a malformed P:D,
// P + D not the job's ranks, tensor parallelism or a draft model beside it, not under mpirun).
Result<DisaggregationOptions> disaggregation_options(const DisaggregateArgs& a, int n_ranks);
// The same for this process's job (MPI_COMM_WORLD's ranks; 1 outside mpirun).
Result<DisaggregationOptions> disaggregation_options(const DisaggregateArgs& a);

// The CPU backend's KV lives in host memory MPI can send from; an error for another backend.
Status check_disaggregated_backend(const Model& model);

// Ranks 1..P (prefill) and P+1..P+D-1 (decode): serve the router until it stops; the
// process's exit code.
int run_role_rank(Model& model, BlockPool& pool, PeerLink& link, const SchedulerOptions& so, const DisaggregationOptions& o);

}  // namespace tandem::apps
