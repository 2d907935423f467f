// Helpers of the runtime's multi-process tests (runtime_test.cc, runtime_moe_test.cc,
// runtime_failure_test.cc, one executable): the sluice binary started on a port the kernel just
// handed out and waited for under a hard deadline, the test models, and comparisons of losses
// and gradient dumps with the single-process reference.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "runtime/dump.h"

namespace sluice::runtime {

inline constexpr double kTolerance = 1e-5;  // relative, losses and gradients
inline constexpr uint64_t kSeed = 1;
inline constexpr double kLr = 1e-3;

// The sluice binary: SLUICE_BINARY (set by CMake), else `sluice` on the PATH.
std::string Binary();
// A port that was free a moment ago (the kernel's choice for port 0).
int FreePort();
// A fresh directory for test `name` under the test's temporary directory.
std::string MakeDir(const std::string& name);

struct Process {
  pid_t pid = -1;
  std::string log;
};

// Starts the sluice binary with `args` and extra environment, output to `log`.
Process Spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
              const std::string& log);

struct Outcome {
  int status = -1;  // exit status, or 128 + signal; -1: killed at the deadline
  std::string output;
  double seconds = 0;
};

// Waits for `p` up to `deadline_s`; kills its process group when it overruns.
Outcome Wait(const Process& p, double deadline_s);
// Runs the sluice binary with `args` on a free MASTER_PORT, its output in `dir`/sluice.log.
Outcome RunSluice(const std::vector<std::string>& args, const std::string& dir,
                  double deadline_s = 240);

ModelSpec Preset(const std::string& name);
// The test models: the tiny presets, and variants whose layers divide by 3 and 6.
ModelSpec TestModel(const std::string& name);
// The --model argument: a preset name, or a JSON file written into `dir`.
std::string ModelArg(const std::string& name, const std::string& dir);

// The `loss` of every line of a --metrics file.
std::vector<double> ReadLosses(const std::string& path);
// max |a - b| / max |b| over a tensor (0 when both are 0).
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);
// Every rank's gradient dump of iteration 0 in `dir` against the reference's: each parameter
// within kTolerance (relative), known, and every reference parameter on some rank. `worst` gets
// the largest relative error, `worst_abs` (when given) the largest absolute difference.
void ExpectGradientsMatch(const std::string& dir, int64_t ranks,
                          const std::vector<NamedValues>& reference, double* worst,
                          double* worst_abs = nullptr);

}  // namespace sluice::runtime
