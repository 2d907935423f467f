#include "base/paths.h"

#include <fmt/core.h>
#include <sys/stat.h>

#include <cstdlib>

#ifndef SLUICE_SOURCE_DATA_DIR
#error "SLUICE_SOURCE_DATA_DIR must be defined by the build"
#endif

namespace sluice {

std::string DataDir() {
  const char* env = std::getenv("SLUICE_DATA_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return SLUICE_SOURCE_DATA_DIR;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

StatusOr<std::string> DataFile(const std::string& relative) {
  const std::string path = DataDir() + "/" + relative;
  if (FileExists(path)) return path;
  return NotFoundError(fmt::format(
      "{}: not found (the data directory is $SLUICE_DATA_DIR if set, else {})", path,
      SLUICE_SOURCE_DATA_DIR));
}

}  // namespace sluice
