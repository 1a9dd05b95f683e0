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
  if (!ec) candidates.push_back(exe.parent_path() / "../../.deps/models" / kDefaultModelFile);
#ifdef KVQ_SOURCE_DIR
  candidates.push_back(fs::path(KVQ_SOURCE_DIR) / ".deps/models" / kDefaultModelFile);
#endif
  for (const fs::path& candidate : candidates) {
    if (fs::is_regular_file(candidate, ec)) return fs::weakly_canonical(candidate, ec).string();
  }
  return "";
}

}  // namespace kvq
