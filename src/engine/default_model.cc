#include "engine/default_model.h"

#include <filesystem>
#include <system_error>
#include <vector>

namespace kvq {

std::string DefaultModelPath() {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> candidates;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path() / "../../models" / kDefaultModelName);
#ifdef KVQ_SOURCE_DIR
  candidates.push_back(fs::path(KVQ_SOURCE_DIR) / "models" / kDefaultModelName);
#endif
  for (const fs::path& candidate : candidates) {
    if (fs::exists(candidate / "config.json", ec)) {
      return fs::weakly_canonical(candidate, ec).string();
    }
  }
  return "";
}

}  // namespace kvq
