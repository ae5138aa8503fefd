// The test binary's main: the same BLAS environment as the stratum binary, then GoogleTest.
//
// Without it the tests ran OpenBLAS with whatever core type the environment forced (this
// workplace sets OPENBLAS_CORETYPE=Haswell), while `stratum` drops it (blas_prepare_process).
// On an AMD EPYC (Zen 4, OpenBLAS 0.3.21) the forced Haswell kernels gave a product split into
// column panels other bits than the whole product, so two exactness tests failed there although
// the kernels that stratum runs (Cooperlake) keep them. The tests check the product's kernels.
#include <gtest/gtest.h>

#include "backend/backend.h"

int main(int argc, char** argv) {
  stratum::backend_prepare_process(argv);  // may re-execute this binary once, with the same arguments
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
