// A study directory read as one study: study.json plus the long stages'
// files, each section from exactly one source and of the same model.
#include "study/study_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json Study(const std::string& model) {
  return {{"kvq_study_version", 2}, {"model", {{"path", model}}}, {"schemes", json::array()}};
}

void Write(const fs::path& path, const json& j) { std::ofstream(path) << j.dump(); }

class StudyFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_util::TestPath("study_files", "model");
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Write(dir_ / "study.json", Study("m.gguf"));
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(StudyFilesTest, DirectoryMergesTheStageFiles) {
  json gsm8k = Study("m.gguf"), context = Study("m.gguf");
  gsm8k["gsm8k"] = {{"problems", 250}};
  context["context_kl"] = {{"lengths", {512}}};
  Write(dir_ / "gsm8k.json", gsm8k);
  Write(dir_ / "context_kl.json", context);
  auto merged = LoadStudy(dir_.string());
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_EQ((*merged)["gsm8k"]["problems"], 250);
  EXPECT_EQ((*merged)["context_kl"]["lengths"][0], 512);
  EXPECT_FALSE(merged->contains("needle"));
  EXPECT_TRUE(merged->contains("schemes"));  // study.json's own sections stay
  // A file path is read as it is: no merging.
  auto alone = LoadStudy((dir_ / "study.json").string());
  ASSERT_TRUE(alone.ok());
  EXPECT_FALSE(alone->contains("gsm8k"));
}

TEST_F(StudyFilesTest, RefusesConflictsOtherModelsAndBrokenFiles) {
  json gsm8k = Study("other.gguf");
  gsm8k["gsm8k"] = json::object();
  Write(dir_ / "gsm8k.json", gsm8k);
  auto other = LoadStudy(dir_.string());
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("model 'other.gguf'"), std::string::npos);

  json study = Study("m.gguf");
  study["gsm8k"] = json::object();  // a --full run holds the section itself
  Write(dir_ / "study.json", study);
  gsm8k["model"]["path"] = "m.gguf";
  Write(dir_ / "gsm8k.json", gsm8k);
  auto twice = LoadStudy(dir_.string());
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("one source per section"), std::string::npos);

  Write(dir_ / "study.json", Study("m.gguf"));
  std::ofstream(dir_ / "gsm8k.json") << "{\"gsm8k\": ";  // cut short
  auto broken = LoadStudy(dir_.string());
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("not valid JSON"), std::string::npos);

  fs::remove(dir_ / "gsm8k.json");
  fs::remove(dir_ / "study.json");
  EXPECT_FALSE(LoadStudy(dir_.string()).ok());  // study.json is required
}

}  // namespace
}  // namespace kvq
