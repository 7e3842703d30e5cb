// Collectives over NCCL for CUDA ranks: device floats on a CUDA stream, one communicator per
// job whose unique id travels over MPI (rank 0 makes it, the world broadcast hands it out).
// Waits are polled against the same deadline as MPI's (cudaStreamQuery and
// ncclCommGetAsyncError); a communicator that times out is aborted (ncclCommAbort), so a dead
// peer is an error, not a hang.
// Built in CI with -DTANDEM_CUDA and -DTANDEM_MPI when NCCL is found; it waits for a machine
// with two GPUs to run (the CUDA backend does not take part in tensor parallelism yet: see
// "GPU ranks (NCCL)" in docs/distributed.md).
#pragma once

#include <memory>

#include "backend/collectives.h"
#include "core/error.h"

namespace tandem {

// world: the MPI job (mpi_world()) that hands out NCCL's unique id; device: this rank's GPU;
// stream: a cudaStream_t (as void*, so callers need no CUDA headers), 0 for the default.
Result<std::shared_ptr<Collectives>> nccl_collectives(Collectives& world, int device, void* stream);

}  // namespace tandem
