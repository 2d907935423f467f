// Where sluice finds the data it ships (profile tables, length datasets).
//
// The project's data/ folder is located, in order, through the SLUICE_DATA_DIR environment
// variable, then the source tree the binary was built from (compiled in). Nothing is looked
// up outside these two places.
#pragma once

#include <string>

#include "base/status.h"

namespace sluice {

// The data directory (no trailing slash).
std::string DataDir();
// DataDir() + "/" + relative, or NotFound naming both places searched.
StatusOr<std::string> DataFile(const std::string& relative);
// True when `path` names an existing regular file.
bool FileExists(const std::string& path);

}  // namespace sluice
