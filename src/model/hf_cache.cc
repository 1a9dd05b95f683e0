#include "model/hf_cache.h"

#include <cctype>
#include <filesystem>
#include <system_error>

#include "io/mapped_file.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

bool HubNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
}

bool IsCommitHash(const std::string& s) {
  if (s.size() != 40) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// refs/<revision> holds a commit hash and nothing else (the hub writes no
// newline, but tolerate one). Read bounded: a ref may be anything on disk.
std::string ReadRef(const fs::path& ref) {
  std::error_code ec;
  if (!fs::is_regular_file(ref, ec)) return "";
  StatusOr<std::string> text = ReadTextFile(ref.string(), 4096);
  if (!text.ok()) return "";
  std::string commit = *text;
  while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) {
    commit.pop_back();
  }
  return IsCommitHash(commit) ? commit : "";
}

// A snapshot folder is a model if it has config.json; a GGUF-only repo
// resolves to its single .gguf file.
StatusOr<std::string> ModelInSnapshot(const fs::path& snapshot) {
  std::error_code ec;
  if (fs::exists(snapshot / "config.json", ec)) return snapshot.string();
  std::vector<std::string> ggufs;
  for (const fs::directory_entry& e : fs::directory_iterator(snapshot, ec)) {
    if (e.path().extension() == ".gguf") ggufs.push_back(e.path().string());
  }
  if (ggufs.size() == 1) return ggufs[0];
  if (ggufs.empty()) {
    return Status::Error(snapshot.string() + ": has neither config.json nor a .gguf file");
  }
  std::string list;
  for (const std::string& g : ggufs) list += "\n  " + g;
  return Status::Error(snapshot.string() + ": holds several .gguf files; pass one with -m:" + list);
}

}  // namespace

bool LooksLikeHubId(const std::string& arg) {
  const size_t slash = arg.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= arg.size()) return false;
  if (arg.find('/', slash + 1) != std::string::npos) return false;
  if (arg[0] == '.' || arg[slash + 1] == '.') return false;
  for (size_t i = 0; i < arg.size(); ++i) {
    if (i != slash && !HubNameChar(arg[i])) return false;
  }
  return true;
}

std::vector<std::string> HubCacheDirs(const std::string& hf_hub_cache, const std::string& hf_home,
                                      const std::string& xdg_cache_home, const std::string& home) {
  std::vector<std::string> dirs;
  if (!hf_hub_cache.empty()) dirs.push_back(hf_hub_cache);
  if (!hf_home.empty()) dirs.push_back((fs::path(hf_home) / "hub").string());
  if (!xdg_cache_home.empty()) {
    dirs.push_back((fs::path(xdg_cache_home) / "huggingface" / "hub").string());
  }
  if (!home.empty()) dirs.push_back((fs::path(home) / ".cache" / "huggingface" / "hub").string());
  return dirs;
}

StatusOr<std::string> ResolveHubModel(const std::string& hub_id,
                                      const std::vector<std::string>& hub_dirs,
                                      const std::string& revision) {
  if (!LooksLikeHubId(hub_id)) {
    return Status::Error("'" + hub_id + "' is not a Hugging Face model id (ORG/NAME)");
  }
  std::string folder = "models--" + hub_id;
  folder.replace(folder.find('/'), 1, "--");
  std::string looked;
  std::error_code ec;
  for (const std::string& dir : hub_dirs) {
    const fs::path repo = fs::path(dir) / folder;
    looked += "\n  " + repo.string();
    if (!fs::is_directory(repo / "snapshots", ec)) {
      looked += " (not there)";
      continue;
    }
    std::string commit = IsCommitHash(revision) ? revision : ReadRef(repo / "refs" / revision);
    if (commit.empty()) {
      // No ref for this revision: accept a lone snapshot, as an offline
      // copy made by hand often has no refs folder.
      std::vector<std::string> snapshots;
      for (const fs::directory_entry& e : fs::directory_iterator(repo / "snapshots", ec)) {
        if (e.is_directory(ec)) snapshots.push_back(e.path().filename().string());
      }
      if (snapshots.size() != 1) {
        looked += " (no refs/" + revision + ", and " + std::to_string(snapshots.size()) +
                  " snapshots to choose from)";
        continue;
      }
      commit = snapshots[0];
    }
    const fs::path snapshot = repo / "snapshots" / commit;
    if (!fs::is_directory(snapshot, ec)) {
      looked += " (refs/" + revision + " names " + commit + ", which has no snapshot)";
      continue;
    }
    return ModelInSnapshot(snapshot);
  }
  if (hub_dirs.empty()) looked = "\n  (no cache folder: HF_HUB_CACHE, HF_HOME and HOME are unset)";
  return Status::Error("model '" + hub_id +
                       "' is neither a path nor in a Hugging Face cache (kvq never downloads). "
                       "Looked in:" +
                       looked);
}

}  // namespace kvq
