#include "runtime/dump.h"

#include <fmt/core.h>

#include <cstring>

#include "base/files.h"

namespace sluice::runtime {
namespace {

void PutI64(std::string* out, int64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
}

}  // namespace

std::string PackageDumpName(int64_t iteration) { return fmt::format("iter-{}.package", iteration); }

std::string GradDumpName(int64_t iteration, int64_t rank) {
  return fmt::format("grads-iter-{}-rank-{}.bin", iteration, rank);
}

Status WriteNamedValues(const std::string& path, const std::vector<NamedValues>& values) {
  std::string out = "SLGD";
  PutI64(&out, static_cast<int64_t>(values.size()));
  for (const NamedValues& v : values) {
    PutI64(&out, static_cast<int64_t>(v.name.size()));
    out += v.name;
    PutI64(&out, static_cast<int64_t>(v.values.size()));
    const size_t at = out.size();
    out.resize(at + v.values.size() * sizeof(float));
    std::memcpy(out.data() + at, v.values.data(), v.values.size() * sizeof(float));
  }
  return WriteFileAtomically(path, out);
}

StatusOr<std::vector<NamedValues>> ReadNamedValues(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(const std::string in,
                          ReadFileToString(path, kDefaultMaxFileBytes, "a gradient dump"));
  size_t pos = 0;
  auto bad = [&](std::string_view what) {
    return InvalidArgumentError(fmt::format("{}: {} at byte {}", path, what, pos));
  };
  auto i64 = [&](int64_t* v) {
    if (pos + 8 > in.size()) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(in[pos + i])) << (8 * i);
    pos += 8;
    *v = static_cast<int64_t>(u);
    return true;
  };
  if (in.compare(0, 4, "SLGD") != 0) return bad("bad magic (not a gradient dump)");
  pos = 4;
  int64_t count = 0;
  if (!i64(&count) || count < 0) return bad("bad count");
  std::vector<NamedValues> out;
  for (int64_t k = 0; k < count; ++k) {
    NamedValues v;
    int64_t len = 0, n = 0;
    if (!i64(&len) || len < 0 || pos + static_cast<size_t>(len) > in.size()) return bad("bad name");
    v.name = in.substr(pos, static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
    if (!i64(&n) || n < 0 || pos + static_cast<size_t>(n) * sizeof(float) > in.size()) {
      return bad("bad value count");
    }
    v.values.resize(static_cast<size_t>(n));
    std::memcpy(v.values.data(), in.data() + pos, static_cast<size_t>(n) * sizeof(float));
    pos += static_cast<size_t>(n) * sizeof(float);
    out.push_back(std::move(v));
  }
  if (pos != in.size()) return bad("trailing bytes");
  return out;
}

}  // namespace sluice::runtime
