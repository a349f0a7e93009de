// main() of every test binary run under mpirun (zinf_add_mpi_test): MPI is
// initialised around the whole GoogleTest run, on every rank.
#include <gtest/gtest.h>

#include "comm/mpi_communicator.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!zinf::comm::MpiInit(&argc, &argv).ok()) return 2;
  const int rc = RUN_ALL_TESTS();
  zinf::comm::MpiFinalize().IgnoreError();
  return rc;
}
