// The GPU tests' gate: skip only where the process has no CUDA device at all; a device that is
// there but cannot be opened (left broken by an earlier fault, say) fails the test, so a crash
// in one test is never reported as "no GPU" by the next.
#pragma once

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

#define NEED_GPU(g)                                                                                       \
  if (const std::string g##_absent = ::tandem::cuda::no_cuda_device(); !g##_absent.empty())             \
    GTEST_SKIP() << "no GPU here: " << g##_absent;                                                        \
  auto g##_made = ::tandem::CudaBackend::create();                                                        \
  ASSERT_TRUE(g##_made.ok()) << "a GPU is present but cannot be used (broken by an earlier fault?): "   \
                             << g##_made.error().message;                                                 \
  ::tandem::CudaBackend& g = *g##_made.value()
