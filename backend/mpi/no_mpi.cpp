// mpi_world() and mpi_peer_link() of a build without MPI (-DTANDEM_MPI=OFF): every process is a job of one.
#include "backend/mpi/mpi_collectives.h"
#include "backend/mpi/mpi_peer_link.h"

namespace tandem {

bool mpi_built() { return false; }
std::shared_ptr<Collectives> mpi_world() { return nullptr; }
std::unique_ptr<PeerLink> mpi_peer_link() { return nullptr; }

}  // namespace tandem
