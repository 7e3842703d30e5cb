// PeerLink (backend/peer_link.h) over MPI for CPU ranks: its own communicator duplicated from
// MPI_COMM_WORLD, control messages and payloads on two tags, every call non-blocking
// (MPI_Isend, MPI_Iprobe, MPI_Irecv, MPI_Test) under one lock, so calls from the engine
// thread and a heartbeat thread never overlap (MPI_THREAD_SERIALIZED).
#pragma once

#include <memory>

#include "backend/peer_link.h"

namespace tandem {

// The job's link when this process runs under mpirun with more than one rank (MPI initialised
// as mpi_world() does); null otherwise, or without MPI. Collective: every rank calls it once,
// at the same point.
std::unique_ptr<PeerLink> mpi_peer_link();

}  // namespace tandem
