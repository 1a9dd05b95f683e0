// ReadTextFile: whole files byte for byte; a missing path or a directory is an
// error that names the path (kvq perplexity/calibrate/tune/study read -f with it).
// MappedFile (model weights) and Sha256File (data and calibration files) open
// with the same checks.
#include "io/mapped_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "io/sha256.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

TEST(ReadTextFile, ReadsEveryByteAndNamesBadPaths) {
  const fs::path dir = fs::path(KVQ_BINARY_DIR) / ("read_text_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string bytes = std::string("line one\r\nzero \0 byte\n", 22) + std::string(70000, 'x');
  const std::string path = (dir / "text.txt").string();
  std::ofstream(path, std::ios::binary) << bytes;
  auto text = ReadTextFile(path);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, bytes);

  const std::string empty_path = (dir / "empty.txt").string();
  std::ofstream(empty_path, std::ios::binary).flush();
  auto empty = ReadTextFile(empty_path);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());

  auto missing = ReadTextFile((dir / "missing.txt").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.txt: cannot open"), std::string::npos)
      << missing.status().message();

  auto directory = ReadTextFile(dir.string());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("is a directory"), std::string::npos)
      << directory.status().message();
  fs::remove_all(dir);
}

// Issue 21, failure 4: devices, FIFOs and oversized files are refused
// before any byte is read (/dev/zero used to be read until memory ran out;
// a FIFO with no writer must not block the open).
TEST(ReadTextFile, RefusesWhatIsNotABoundedRegularFile) {
  for (const char* device : {"/dev/zero", "/dev/urandom", "/dev/null"}) {
    auto text = ReadTextFile(device);
    ASSERT_FALSE(text.ok()) << device;
    EXPECT_NE(text.status().message().find("not a regular file"), std::string::npos)
        << text.status().message();
  }
  const fs::path dir = fs::path(KVQ_BINARY_DIR) / ("read_bounded_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto from_fifo = ReadTextFile(fifo);
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_NE(from_fifo.status().message().find("FIFO"), std::string::npos);
  auto from_dir = ReadTextFile(dir.string());
  ASSERT_FALSE(from_dir.ok());
  EXPECT_NE(from_dir.status().message().find("directory"), std::string::npos);
  const std::string big = (dir / "big.txt").string();
  std::ofstream(big) << std::string(1001, 'x');
  auto limited = ReadTextFile(big, 1000);
  ASSERT_FALSE(limited.ok());
  EXPECT_NE(limited.status().message().find("1001 bytes"), std::string::npos);
  EXPECT_TRUE(ReadTextFile(big, 1001).ok());
  fs::remove_all(dir);
}

// A model path or a hashed data file that is a FIFO, device or directory is
// refused at once: MappedFile used to open a FIFO without O_NONBLOCK and
// wait for a writer forever (`kvq generate -m FIFO` hung).
TEST(MappedFile, RefusesWhatIsNotARegularFileWithoutWaiting) {
  const fs::path dir = fs::path(KVQ_BINARY_DIR) / ("map_bounded_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const struct {
    std::string path, says;
  } cases[] = {{fifo, "is a FIFO"},
               {dir.string(), "is a directory"},
               {"/dev/zero", "is a character device"}};
  for (const auto& c : cases) {
    auto mapped = MappedFile::Open(c.path);
    ASSERT_FALSE(mapped.ok()) << c.path;
    EXPECT_NE(mapped.status().message().find(c.says), std::string::npos)
        << mapped.status().message();
    auto digest = Sha256File(c.path);
    ASSERT_FALSE(digest.ok()) << c.path;
    EXPECT_NE(digest.status().message().find(c.says), std::string::npos)
        << digest.status().message();
  }
  const std::string file = (dir / "weights.bin").string();
  std::ofstream(file) << "abc";
  auto mapped = MappedFile::Open(file);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  ASSERT_EQ((*mapped)->size(), 3u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*mapped)->data()), 3), "abc");
  fs::remove_all(dir);
}

// Every output file goes through WriteTextFile: what it writes reads back
// byte for byte, a full disk (/dev/full) or a folder is an error naming the
// reason, not a silently short file, and a failed write keeps the old file.
TEST(WriteTextFile, WritesWholeFilesAndReportsFullDisks) {
  const fs::path dir = fs::path(KVQ_BINARY_DIR) / ("write_text_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "out.json").string();
  const std::string text = std::string(100000, 'k') + "\n";
  ASSERT_TRUE(WriteTextFile(path, "a longer first version\n").ok());
  ASSERT_TRUE(WriteTextFile(path, text).ok());
  auto back = ReadTextFile(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, text);
  if (fs::exists("/dev/full")) {  // Linux's always-full device (a container may lack it)
    const Status full = WriteTextFile("/dev/full", "x");
    ASSERT_FALSE(full.ok());
    EXPECT_NE(full.message().find("/dev/full: write failed: No space left"), std::string::npos)
        << full.message();
  }
  const Status folder = WriteTextFile(dir.string(), "x");
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.message().find("cannot open for writing"), std::string::npos)
      << folder.message();
  // The new text goes beside the file first: where that cannot be written
  // (a folder squats on the name), the write fails and the old file stays
  // whole. Nothing is left beside it after a success.
  const fs::path squatter = path + ".tmp-" + std::to_string(::getpid());
  fs::create_directory(squatter);
  ASSERT_FALSE(WriteTextFile(path, "new").ok());
  back = ReadTextFile(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, text);
  fs::remove(squatter);
  ASSERT_TRUE(WriteTextFile(path, "new").ok());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvq
