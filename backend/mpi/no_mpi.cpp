// mpi_world() of a build without MPI (-DTANDEM_MPI=OFF): every process is a job of one.
#include "backend/mpi/mpi_collectives.h"

namespace tandem {

bool mpi_built() { return false; }
std::shared_ptr<Collectives> mpi_world() { return nullptr; }

}  // namespace tandem
