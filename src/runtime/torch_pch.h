// The precompiled header of the torch translation units of src/runtime/ (CMake
// target_precompile_headers): libtorch's headers take ~20 s per TU to parse; this parses them
// once per build. Only src/runtime/ may include torch (ARCHITECTURE.md).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
