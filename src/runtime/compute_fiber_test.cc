// NewComputeFiber: a segmented op's fiber computes with the process's thread count
// (torch::set_num_threads, `sluice train --threads`), not with OpenMP's default team of a new
// thread, which the BLAS calls in it would use.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <torch/torch.h>

#include "runtime/segmented_ops.h"

namespace sluice::runtime {
namespace {

TEST(ComputeFiberTest, RunsWithTheProcesssThreadCount) {
  const int before = at::get_num_threads();
  // A count no machine's default team is likely to have (the default is the cores).
  constexpr int kThreads = 7;
  torch::set_num_threads(kThreads);
  int plain = -1, compute = -1;
  Fiber f([&] { plain = omp_get_max_threads(); });
  f.Resume();
  std::unique_ptr<Fiber> g = NewComputeFiber([&] {
    compute = omp_get_max_threads();
    // The BLAS of this thread runs with it: a product is still right.
    const at::Tensor a = torch::ones({64, 64});
    EXPECT_EQ(torch::mm(a, a).sum().item<double>(), 64.0 * 64 * 64);
  });
  g->Resume();
  torch::set_num_threads(before);
  EXPECT_TRUE(g->finished());
  EXPECT_EQ(compute, kThreads);
  // What the fix is for: a plain thread has OpenMP's default team (unless the environment set
  // OMP_NUM_THREADS to the same count).
  if (plain == kThreads) GTEST_SKIP() << "this machine's default OpenMP team is " << kThreads;
  EXPECT_NE(plain, compute);
}

}  // namespace
}  // namespace sluice::runtime
