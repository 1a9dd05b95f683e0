#include "study/study_files.h"

#include <filesystem>

#include "io/mapped_file.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

StatusOr<Json> ParseObjectFile(const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error(path + ": not valid JSON");
  if (!j.is_object()) return Status::Error(path + ": expected a JSON object");
  return j;
}

// The model file a study JSON names ("" when it names none).
std::string ModelPath(const Json& study) {
  const auto model = study.find("model");
  if (model == study.end() || !model->is_object()) return "";
  const auto path = model->find("path");
  return path != model->end() && path->is_string() ? path->get<std::string>() : "";
}

}  // namespace

StatusOr<Json> LoadStudy(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return ParseObjectFile(path);
  const fs::path dir(path);
  KVQ_ASSIGN_OR_RETURN(Json study, ParseObjectFile((dir / "study.json").string()));
  for (const auto& [file, section] : kStageFiles) {
    const std::string stage_path = (dir / file).string();
    if (!fs::exists(stage_path, ec)) continue;
    KVQ_ASSIGN_OR_RETURN(Json stage, ParseObjectFile(stage_path));
    if (stage.value("kvq_study_version", Json()) != study.value("kvq_study_version", Json())) {
      return Status::Error(stage_path + ": another kvq_study_version than study.json's");
    }
    if (ModelPath(stage) != ModelPath(study)) {
      return Status::Error(stage_path + ": model '" + ModelPath(stage) +
                           "', but study.json's is '" + ModelPath(study) + "'");
    }
    if (!stage.contains(section)) return Status::Error(stage_path + ": no \"" + section + "\"");
    if (study.contains(section)) {
      return Status::Error(stage_path + ": study.json already holds \"" + section +
                           "\" (one source per section)");
    }
    study[section] = std::move(stage[section]);
  }
  return study;
}

}  // namespace kvq
