#include "base/files.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

namespace sluice {
namespace {

// "1 GiB", "256 MiB", "1,000 bytes" for the read bound in messages.
std::string SizeText(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) {
    return fmt::format("{} GiB", bytes >> 30);
  }
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) {
    return fmt::format("{} MiB", bytes >> 20);
  }
  return fmt::format("{} bytes", bytes);
}

std::string KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// "PATH: WHAT (OS reason)SUFFIX".
Status OsError(const std::string& path, std::string_view what, int err,
               std::string_view suffix = "") {
  return IoError(fmt::format("{}: {} ({}){}", path, what, std::strerror(err), suffix));
}

constexpr std::string_view kKept = "; the previous file (if any) is unchanged";

// Writes all of `data` to `fd`, retrying short writes and EINTR; errno of the failure, or 0.
int WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

}  // namespace

StatusOr<std::string> ReadFileToString(const std::string& path, int64_t max_bytes,
                                       std::string_view what) {
  // O_NONBLOCK: opening a device must not wait (a pipe is opened again below, waiting for its
  // writer as a blocking open does).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return Status(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                  fmt::format("{}: cannot open ({})", path, std::strerror(err)));
  }
  struct FdCloser {
    int& fd;
    ~FdCloser() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return OsError(path, "cannot read", errno);
  if (S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(fmt::format("{}: is a folder; expected a file", path));
  }
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    return InvalidArgumentError(fmt::format(
        "{}: is {}; expected a regular file (or a pipe)", path, KindOf(st.st_mode)));
  }
  const auto too_big = [&](const std::string& size) {
    std::string limit = SizeText(max_bytes);
    if (limit.find("bytes") == std::string::npos) limit += fmt::format(" ({} bytes)", max_bytes);
    return InvalidArgumentError(
        fmt::format("{}: {}; {} may hold at most {}", path, size, what, limit));
  };
  if (S_ISREG(st.st_mode) && st.st_size > max_bytes) {
    return too_big(fmt::format("the file has {} bytes", static_cast<int64_t>(st.st_size)));
  }
  if (S_ISFIFO(st.st_mode)) {
    // A non-blocking read end sees end-of-file until a writer comes: wait for one instead.
    ::close(fd);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return OsError(path, "cannot open", errno);
  } else {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  }
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  std::vector<char> buf(1 << 16);
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return OsError(path, "read failed", errno);
    }
    if (n == 0) break;
    if (static_cast<int64_t>(out.size()) + n > max_bytes) {
      return too_big(fmt::format("more than {} bytes were read", max_bytes));
    }
    out.append(buf.data(), static_cast<size_t>(n));
  }
  return out;
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string target, std::string temp, int fd,
                                   bool in_place)
    : path_(std::move(path)),
      target_(std::move(target)),
      temp_(std::move(temp)),
      fd_(fd),
      in_place_(in_place) {}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : path_(std::move(o.path_)),
      target_(std::move(o.target_)),
      temp_(std::move(o.temp_)),
      fd_(std::exchange(o.fd_, -1)),
      in_place_(o.in_place_),
      status_(std::move(o.status_)) {
  o.temp_.clear();
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return InvalidArgumentError("the output path is empty");
  std::string target = path;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    // Replace the link's target, not the link; a dangling link is replaced by the file.
    std::error_code ec;
    const fs::path resolved = fs::canonical(path, ec);
    if (!ec) target = resolved.string();
  }
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return IoError(fmt::format("{}: cannot write: it is a folder", path));
    }
    if (!S_ISREG(st.st_mode)) {
      // A device or a pipe: nothing to keep, and renaming onto it would replace the device.
      const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) return OsError(path, "cannot open for writing", errno);
      return AtomicFileWriter(path, target, "", fd, /*in_place=*/true);
    }
  }
  std::string temp = target + ".tmp-XXXXXX";
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) {
    return OsError(path, fmt::format("cannot create a temporary file beside it ('{}')", temp),
                   errno);
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  // mkstemp makes 0600; give the file the previous file's mode, else what open(2) would give.
  mode_t mode = 0;
  if (::stat(target.c_str(), &st) == 0) {
    mode = st.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  ::fchmod(fd, mode);
  return AtomicFileWriter(path, std::move(target), std::move(temp), fd, /*in_place=*/false);
}

Status AtomicFileWriter::Append(std::string_view data) {
  SLUICE_RETURN_IF_ERROR(status_);
  if (fd_ < 0) return status_ = InternalError(fmt::format("{}: written after Commit()", path_));
  if (const int err = WriteAll(fd_, data); err != 0) {
    status_ = OsError(path_, "write failed", err, in_place_ ? "" : kKept);
    Abandon();
  }
  return status_;
}

Status AtomicFileWriter::Commit() {
  SLUICE_RETURN_IF_ERROR(status_);
  if (fd_ < 0) return status_ = InternalError(fmt::format("{}: committed twice", path_));
  if (in_place_) {
    const int rc = ::close(std::exchange(fd_, -1));
    if (rc != 0) return status_ = OsError(path_, "write failed", errno);
    return Status::Ok();
  }
  // fsync before rename: after a crash the name holds the old file or the whole new one.
  if (::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) {
    status_ = OsError(path_, "write failed", errno, kKept);
    Abandon();
    return status_;
  }
  if (::close(std::exchange(fd_, -1)) != 0) {
    status_ = OsError(path_, "write failed", errno, kKept);
    Abandon();
    return status_;
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    status_ = OsError(path_, "cannot put the new file in place", errno, kKept);
    Abandon();
    return status_;
  }
  temp_.clear();
  // The rename itself is durable once the folder is synced (best effort).
  const std::string dir = std::filesystem::path(target_).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  SLUICE_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  SLUICE_RETURN_IF_ERROR(w.Append(contents));
  return w.Commit();
}

Status WriteStringToFile(const std::string& path, std::string_view contents) {
  return WriteFileAtomically(path, contents);
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (a.empty() || b.empty()) return false;
  const bool has_a = ::stat(a.c_str(), &sa) == 0, has_b = ::stat(b.c_str(), &sb) == 0;
  if (has_a && has_b) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (has_a || has_b) return false;
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  const fs::path pa = fs::weakly_canonical(fs::absolute(a, ea), ea);
  const fs::path pb = fs::weakly_canonical(fs::absolute(b, eb), eb);
  return !ea && !eb && pa == pb;
}

}  // namespace sluice
