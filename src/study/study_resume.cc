#include "study/study_resume.h"

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "io/mapped_file.h"

namespace kvq {

namespace fs = std::filesystem;

Status PrepareResultDir(const std::string& dir, const nlohmann::json& config) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::Error(dir + ": cannot create the results directory: " + ec.message());
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path, ec)) {
    const std::string tmp = path + ".tmp";
    KVQ_RETURN_IF_ERROR(WriteTextFile(tmp, config.dump(1) + "\n"));
    fs::rename(tmp, path, ec);  // atomic: a half-written config never exists
    if (ec) return Status::Error(path + ": " + ec.message());
    return Status::Ok();
  }
  KVQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  nlohmann::json stored = nlohmann::json::parse(text, nullptr, false);
  if (stored.is_discarded()) return Status::Error(path + ": not valid JSON");
  if (stored != config) {
    return Status::Error(dir +
                         " holds results of a different configuration (config.json differs: "
                         "stored " +
                         stored.dump() + ", now " + config.dump() +
                         "); pass another results directory or delete this one");
  }
  return Status::Ok();
}

StatusOr<ResultLog> ResultLog::Open(const std::string& path) {
  ResultLog log;
  log.path_ = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) return log;
  KVQ_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  size_t complete = text.rfind('\n');
  complete = complete == std::string::npos ? 0 : complete + 1;
  if (complete < text.size()) {
    fs::resize_file(path, complete, ec);  // drop the cut-short line
    if (ec) return Status::Error(path + ": cannot drop an incomplete last line: " + ec.message());
  }
  std::istringstream in(text.substr(0, complete));
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object()) {
      return Status::Error(path + ":" + std::to_string(n) + ": not a JSON object");
    }
    log.records_.push_back(std::move(record));
  }
  return log;
}

Status ResultLog::Append(const nlohmann::json& record) {
  nlohmann::json stamped = record;
  stamped["simd_target"] = SimdTargetName();
  const std::string line = stamped.dump() + "\n";
  std::FILE* f = std::fopen(path_.c_str(), "ab");
  if (f == nullptr) return Status::Error(path_ + ": cannot open for appending");
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size() && std::fflush(f) == 0;
  std::fclose(f);
  if (!ok) return Status::Error(path_ + ": write failed");
  records_.push_back(std::move(stamped));
  return Status::Ok();
}

std::string ResultFileStem(const std::string& name) {
  uint32_t hash = 2166136261u;  // FNV-1a
  std::string stem;
  for (char c : name) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-' || c == '_';
    stem += keep ? c : '_';
  }
  if (stem.size() > 64) stem.resize(64);
  char hex[16];
  std::snprintf(hex, sizeof(hex), "-%08x", hash);
  return stem + hex;
}

}  // namespace kvq
