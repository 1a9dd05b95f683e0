#include "model/hf_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/model_files.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

const char* kCommit = "0123456789abcdef0123456789abcdef01234567";

// A hub cache laid out as huggingface_hub writes it: blobs, a snapshot of
// symlinks into them, and refs/main naming the snapshot.
class HubCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("kvq_hub_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    hub_ = root_ / "hub";
  }
  void TearDown() override { fs::remove_all(root_); }

  // models--org--name with the shipped model's files as blobs.
  fs::path MakeRepo(const std::string& org, const std::string& name, bool with_ref) {
    const fs::path repo = hub_ / ("models--" + org + "--" + name);
    const fs::path snapshot = repo / "snapshots" / kCommit;
    fs::create_directories(snapshot);
    fs::create_directories(repo / "blobs");
    const fs::path src = fs::path(KVQ_SOURCE_DIR) / "models" / "kvq-tiny-qwen2";
    int blob = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(src)) {
      if (!e.is_regular_file()) continue;  // training/ holds the model card's sources
      const fs::path b = repo / "blobs" / ("blob" + std::to_string(blob++));
      fs::copy_file(e.path(), b);
      fs::create_symlink(fs::path("../../blobs") / b.filename(), snapshot / e.path().filename());
    }
    if (with_ref) {
      fs::create_directories(repo / "refs");
      std::ofstream(repo / "refs" / "main") << kCommit;  // no newline, as the hub writes it
    }
    return snapshot;
  }

  fs::path root_, hub_;
};

TEST(HubIdTest, TellsIdsFromPaths) {
  EXPECT_TRUE(LooksLikeHubId("Qwen/Qwen2.5-0.5B"));
  EXPECT_TRUE(LooksLikeHubId("HuggingFaceTB/SmolLM2-135M-Instruct"));
  EXPECT_FALSE(LooksLikeHubId("model.gguf"));
  EXPECT_FALSE(LooksLikeHubId("./Qwen/x"));
  EXPECT_FALSE(LooksLikeHubId("/abs/path"));
  EXPECT_FALSE(LooksLikeHubId("a/b/c"));
  EXPECT_FALSE(LooksLikeHubId("a/"));
  EXPECT_FALSE(LooksLikeHubId("a/.."));
  EXPECT_FALSE(LooksLikeHubId("a b/c"));
}

TEST(HubIdTest, CacheDirsFollowHuggingFaceOrder) {
  EXPECT_EQ(HubCacheDirs("/c", "/h", "/x", "/home/u"),
            (std::vector<std::string>{"/c", "/h/hub", "/x/huggingface/hub",
                                      "/home/u/.cache/huggingface/hub"}));
  EXPECT_EQ(HubCacheDirs("", "", "", "/home/u"),
            (std::vector<std::string>{"/home/u/.cache/huggingface/hub"}));
  EXPECT_TRUE(HubCacheDirs("", "", "", "").empty());
}

TEST_F(HubCacheTest, ResolvesTheSnapshotThatRefsMainNamesAndItLoads) {
  const fs::path snapshot = MakeRepo("kvq", "tiny", /*with_ref=*/true);
  auto path = ResolveHubModel("kvq/tiny", {(root_ / "elsewhere").string(), hub_.string()});
  ASSERT_TRUE(path.ok()) << path.status().message();
  EXPECT_EQ(*path, snapshot.string());
  auto files = OpenModel(*path);
  ASSERT_TRUE(files.ok()) << files.status().message();
  EXPECT_GT(files->tensors.size(), 0u);
  // A commit hash as the revision selects the same snapshot.
  auto by_hash = ResolveHubModel("kvq/tiny", {hub_.string()}, kCommit);
  ASSERT_TRUE(by_hash.ok()) << by_hash.status().message();
  EXPECT_EQ(*by_hash, snapshot.string());
}

TEST_F(HubCacheTest, ALoneSnapshotWithoutRefsIsAccepted) {
  const fs::path snapshot = MakeRepo("kvq", "tiny", /*with_ref=*/false);
  auto path = ResolveHubModel("kvq/tiny", {hub_.string()});
  ASSERT_TRUE(path.ok()) << path.status().message();
  EXPECT_EQ(*path, snapshot.string());
}

TEST_F(HubCacheTest, AGgufOnlyRepoResolvesToItsFile) {
  const fs::path snapshot = hub_ / "models--org--g" / "snapshots" / kCommit;
  fs::create_directories(snapshot);
  std::ofstream(snapshot / "m.Q4_0.gguf") << "GGUF";
  auto path = ResolveHubModel("org/g", {hub_.string()});
  ASSERT_TRUE(path.ok()) << path.status().message();
  EXPECT_EQ(*path, (snapshot / "m.Q4_0.gguf").string());
  std::ofstream(snapshot / "m.Q8_0.gguf") << "GGUF";
  auto two = ResolveHubModel("org/g", {hub_.string()});
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("several .gguf"), std::string::npos);
}

TEST_F(HubCacheTest, AMissingModelListsEveryPlaceLookedIn) {
  MakeRepo("kvq", "tiny", true);
  const std::string other = (root_ / "other").string();
  auto path = ResolveHubModel("Qwen/Qwen2.5-0.5B", {other, hub_.string()});
  ASSERT_FALSE(path.ok());
  const std::string& m = path.status().message();
  EXPECT_NE(m.find("never downloads"), std::string::npos) << m;
  EXPECT_NE(m.find(other + "/models--Qwen--Qwen2.5-0.5B"), std::string::npos) << m;
  EXPECT_NE(m.find(hub_.string() + "/models--Qwen--Qwen2.5-0.5B"), std::string::npos) << m;
  // A ref naming a snapshot that is not there is reported, not followed.
  auto bad_rev =
      ResolveHubModel("kvq/tiny", {hub_.string()}, "ffffffffffffffffffffffffffffffffffffffff");
  ASSERT_FALSE(bad_rev.ok());
  EXPECT_NE(bad_rev.status().message().find("has no snapshot"), std::string::npos)
      << bad_rev.status().message();
}

}  // namespace
}  // namespace kvq
