// Standalone replay for the fuzz targets in builds without libFuzzer (gcc, the default build):
// runs LLVMFuzzerTestOneInput once on every file named on the command line, and on every file of
// every folder named (not recursive), so the seed corpus (fuzz/corpus/<target>/: deep nesting,
// duplicate keys, edge sizes) runs as a ctest in every build. A target's invariant failure aborts,
// failing the test; the output names each file as it runs so the failing input is the last named.
// A folder's inputs named in `<folder>.known-failures` (one file name per line, then '#' and the
// reason: open bugs the seed found) are listed as skipped, not run; `--all` runs them too.
//
//   <target>_replay [--all] FILE_OR_FOLDER...
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  bool all = false;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (std::string(argv[i]) == "--all") {
      all = true;
    } else if (fs::is_directory(argv[i], ec)) {
      std::map<std::string, std::string> known;  // file name -> reason
      std::ifstream list(fs::path(argv[i]).string() + ".known-failures");
      for (std::string line; std::getline(list, line);) {
        const size_t hash = line.find('#');
        std::string name = line.substr(0, hash);
        name.erase(name.find_last_not_of(" \t") + 1);
        if (!name.empty()) known[name] = hash == std::string::npos ? "" : line.substr(hash + 1);
      }
      for (const auto& e : fs::directory_iterator(argv[i])) {
        if (!e.is_regular_file()) continue;
        const auto k = known.find(e.path().filename().string());
        if (k != known.end() && !all) {
          std::printf("skip %s (known failure:%s)\n", e.path().c_str(), k->second.c_str());
          continue;
        }
        files.push_back(e.path());
      }
    } else {
      files.emplace_back(argv[i]);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "replay: no input files\n");
    return 2;
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "replay: cannot read %s\n", f.c_str());
      return 2;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::printf("replay %s (%zu bytes)\n", f.c_str(), bytes.size());
    std::fflush(stdout);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %zu inputs, no crash\n", files.size());
  return 0;
}
