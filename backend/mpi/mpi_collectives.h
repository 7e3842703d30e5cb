// Collectives over MPI (Open MPI from Debian) for CPU ranks: host floats, one communicator
// duplicated from MPI_COMM_WORLD. Every operation is non-blocking underneath (MPI_Iallreduce,
// MPI_Iallgather, MPI_Ibcast) and polled against a deadline, so a dead peer is an error on the
// caller within timeout_s instead of a hang. Calls come from one thread at a time
// (MPI_THREAD_SERIALIZED): a pass makes them from its calling thread, and rank 0's
// heartbeat from its own, each holding Collectives::step_mu.
#pragma once

#include <memory>

#include "backend/collectives.h"

namespace tandem {

// The job's world when this process runs under mpirun (or another MPI launcher) with more
// than one rank: MPI is initialised on the first call (and finalised at exit); null for a
// plain process, which then never touches MPI.
std::shared_ptr<Collectives> mpi_world();

// True when this binary was built with MPI (-DTANDEM_MPI=ON).
bool mpi_built();

}  // namespace tandem
