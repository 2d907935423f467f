// Whole-file reads with a size bound, and writes that never leave a half-written file.
//
// Reads: ReadFileToString refuses folders, devices and sockets (a device such as /dev/zero never
// ends) and reads at most `max_bytes`; pipes are read up to the bound. The bound depends on what
// the file holds (kMaxConfigFileBytes, kMaxPlanFileBytes, kMaxDataFileBytes); errors name the
// path, the size and the bound.
//
// Writes: WriteFileAtomically writes `PATH.tmp-XXXXXX` in the same folder, syncs it to disk and
// renames it onto PATH, so a reader sees either the previous file or the whole new one; a failed
// write (full disk, file-size limit, unwritable folder) removes the temporary file and leaves the
// previous PATH as it was. A PATH that exists and is not a regular file (/dev/null, /dev/stdout, a
// pipe) is written in place: there is nothing to keep. A symbolic link is followed: its target is
// replaced and the link stays. AtomicFileWriter is the streaming form of the same.
//
// Thread safety: the functions are thread-safe; an AtomicFileWriter is used by one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace sluice {

// Read bounds by kind of file (bytes). Configurations (model, cluster, parallel, scenario, cost
// table, compare results) are at most a few MB; plans of large runs reach hundreds of MB.
inline constexpr int64_t kMaxConfigFileBytes = int64_t{256} << 20;  // 256 MiB
inline constexpr int64_t kMaxPlanFileBytes = int64_t{1} << 30;      // 1 GiB
inline constexpr int64_t kMaxDataFileBytes = int64_t{4} << 30;      // 4 GiB (length datasets)
inline constexpr int64_t kDefaultMaxFileBytes = int64_t{1} << 30;   // 1 GiB (any other file)

// Reads a whole file of at most `max_bytes` bytes. Errors name the path: NotFound when it does not
// exist; InvalidArgument for a folder, a device or a socket, and for a file larger than
// `max_bytes` (`what` names the kind in that message: "a plan file may hold at most 1 GiB");
// IoError for other OS failures.
StatusOr<std::string> ReadFileToString(const std::string& path,
                                       int64_t max_bytes = kDefaultMaxFileBytes,
                                       std::string_view what = "a file");

// Replaces `path` with `contents` atomically (see above). IoError naming the path and the OS
// reason on failure; the previous file is then unchanged.
Status WriteFileAtomically(const std::string& path, std::string_view contents);
// The same (kept for the callers that predate the atomic writer).
Status WriteStringToFile(const std::string& path, std::string_view contents);

// Writes a file piece by piece and puts it in place at Commit() (same guarantees as
// WriteFileAtomically). Destroying a writer that was not committed removes its temporary file.
class AtomicFileWriter {
 public:
  static StatusOr<AtomicFileWriter> Create(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // Appends `data`; after an error every later call returns it again.
  Status Append(std::string_view data);
  // Syncs, closes and renames the temporary file onto the path. REQUIRES: called once.
  Status Commit();

  const std::string& path() const { return path_; }

 private:
  AtomicFileWriter(std::string path, std::string target, std::string temp, int fd, bool in_place);
  void Abandon();

  std::string path_;    // as given (for messages)
  std::string target_;  // what is replaced: the path, or a symbolic link's target
  std::string temp_;    // the temporary file ("" when writing in place)
  int fd_ = -1;
  bool in_place_ = false;
  Status status_;
};

// True when `a` and `b` name the same file: both exist and are one (same device and inode, after
// following symbolic links), so "out.json" and "./sub/../out.json" or a hard link compare equal;
// or neither exists yet and their absolute paths are equal once normalised (the existing part
// of each resolved through its symbolic links), so two outputs about to be written are too.
bool SameFile(const std::string& a, const std::string& b);

}  // namespace sluice
