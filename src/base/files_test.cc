#include "base/files.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <string>

namespace sluice {
namespace {

namespace fs = std::filesystem;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt_dir();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string fmt_dir() {
    return "sluice-files-test-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // Names in the folder other than `keep` (temporary files left behind show here).
  int Entries() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) {
      (void)e;
      ++n;
    }
    return n;
  }
  fs::path dir_;
};

std::string Read(const std::string& path) {
  StatusOr<std::string> s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : "";
}

TEST_F(FilesTest, WriteReplacesAndLeavesNoTemporaryFile) {
  const std::string p = Path("out.json");
  ASSERT_TRUE(WriteFileAtomically(p, "first").ok());
  EXPECT_EQ(Read(p), "first");
  ASSERT_TRUE(WriteFileAtomically(p, "second, longer").ok());
  EXPECT_EQ(Read(p), "second, longer");
  ASSERT_TRUE(WriteFileAtomically(p, "").ok());
  EXPECT_EQ(Read(p), "");
  EXPECT_EQ(Entries(), 1);
}

TEST_F(FilesTest, KeepsTheModeOfTheFileItReplaces) {
  const std::string p = Path("mode.txt");
  ASSERT_TRUE(WriteFileAtomically(p, "a").ok());
  ASSERT_EQ(::chmod(p.c_str(), 0640), 0);
  ASSERT_TRUE(WriteFileAtomically(p, "b").ok());
  struct stat st;
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

// A write that fails half way (the file-size limit stands in for a full disk) leaves the previous
// file whole and no temporary file.
TEST_F(FilesTest, FailedWriteKeepsThePreviousFile) {
  const std::string p = Path("plan.json");
  ASSERT_TRUE(WriteFileAtomically(p, "previous valid plan").ok());
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  struct rlimit small = old;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Status s = WriteFileAtomically(p, std::string(100000, 'x'));
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous_handler);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("the previous file (if any) is unchanged"), std::string::npos)
      << s.message();
  EXPECT_EQ(Read(p), "previous valid plan");
  EXPECT_EQ(Entries(), 1);
}

TEST_F(FilesTest, StreamingWriterAbandonedLeavesThePreviousFile) {
  const std::string p = Path("stream.txt");
  ASSERT_TRUE(WriteFileAtomically(p, "old").ok());
  {
    StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(p);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append("new ").ok());
    ASSERT_TRUE(w->Append("text").ok());
    EXPECT_EQ(Read(p), "old");  // nothing visible before Commit()
    EXPECT_EQ(Entries(), 2);    // the temporary file
  }
  EXPECT_EQ(Read(p), "old");
  EXPECT_EQ(Entries(), 1);
  StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(p);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Append("new text").ok());
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(Read(p), "new text");
  EXPECT_EQ(Entries(), 1);
}

TEST_F(FilesTest, MissingFolderNamesThePath) {
  const std::string p = Path("no/such/out.json");
  const Status s = WriteFileAtomically(p, "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("No such file or directory"), std::string::npos) << s.message();
}

TEST_F(FilesTest, DeviceIsWrittenInPlace) {
  EXPECT_TRUE(WriteFileAtomically("/dev/null", "discarded").ok());
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));  // still the device, not a file renamed onto it
  if (::access("/dev/full", W_OK) == 0) {
    const Status s = WriteFileAtomically("/dev/full", "x");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("/dev/full: write failed (No space left on device)"),
              std::string::npos)
        << s.message();
  }
}

TEST_F(FilesTest, SymbolicLinkKeepsPointingAtTheReplacedFile) {
  const std::string real = Path("real.json"), link = Path("link.json");
  ASSERT_TRUE(WriteFileAtomically(real, "old").ok());
  fs::create_symlink(real, link);
  ASSERT_TRUE(WriteFileAtomically(link, "new").ok());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(Read(real), "new");
}

TEST_F(FilesTest, ReadRefusesDevicesFoldersAndTooBigFiles) {
  StatusOr<std::string> zero = ReadFileToString("/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(zero.status().message(),
            "/dev/zero: is a character device; expected a regular file (or a pipe)");
  StatusOr<std::string> folder = ReadFileToString(dir_.string());
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.status().message().find("is a folder"), std::string::npos);
  const std::string p = Path("big.json");
  ASSERT_TRUE(WriteFileAtomically(p, std::string(2000, ' ')).ok());
  StatusOr<std::string> big = ReadFileToString(p, 1024, "a test file");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(big.status().message(),
            p + ": the file has 2000 bytes; a test file may hold at most 1024 bytes");
  EXPECT_TRUE(ReadFileToString(p, 2000).ok());
  StatusOr<std::string> missing = ReadFileToString(Path("missing"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(FilesTest, SameFileComparesInodes) {
  const std::string a = Path("a.json");
  ASSERT_TRUE(WriteFileAtomically(a, "x").ok());
  EXPECT_TRUE(SameFile(a, a));
  EXPECT_TRUE(SameFile(a, (dir_ / "." / "a.json").string()));
  fs::create_hard_link(a, Path("hard.json"));
  EXPECT_TRUE(SameFile(a, Path("hard.json")));
  ASSERT_TRUE(WriteFileAtomically(Path("b.json"), "x").ok());
  EXPECT_FALSE(SameFile(a, Path("b.json")));
  EXPECT_FALSE(SameFile(a, Path("missing.json")));
  // Two paths of a file not written yet: the same once normalised, through symbolic links.
  EXPECT_TRUE(SameFile(Path("new.json"), (dir_ / "sub" / ".." / "new.json").string()));
  EXPECT_FALSE(SameFile(Path("new.json"), Path("other.json")));
  fs::create_directory_symlink(dir_, Path("link"));
  EXPECT_TRUE(SameFile(Path("new.json"), (dir_ / "link" / "new.json").string()));
  EXPECT_FALSE(SameFile(Path("new.json"), ""));
}

}  // namespace
}  // namespace sluice
