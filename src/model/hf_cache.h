// Finding a model that a user already has in the standard Hugging Face hub
// cache, offline: `-m Qwen/Qwen2.5-0.5B` means
//   <hub>/models--Qwen--Qwen2.5-0.5B/snapshots/<commit>/
// where <commit> is what refs/<revision> names (or the only snapshot when
// there are no refs). Nothing is downloaded.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace kvq {

// True for an "ORG/NAME" hub id: two non-empty parts of letters, digits and
// -_. (the hub's rule), not starting with '.' or '/'. "./x", "/a/b", "a/b/c"
// and "a.gguf" are not hub ids.
bool LooksLikeHubId(const std::string& arg);

// The hub cache roots to search, in the order huggingface_hub uses them:
// $HF_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub,
// $HOME/.cache/huggingface/hub. Each argument is that variable's value
// (empty = unset); the caller reads the environment.
std::vector<std::string> HubCacheDirs(const std::string& hf_hub_cache, const std::string& hf_home,
                                      const std::string& xdg_cache_home, const std::string& home);

// The snapshot folder of `hub_id` at `revision` ("main", another ref, or a
// commit hash) in the first of `hub_dirs` that has the model. When the
// snapshot holds no config.json but exactly one .gguf file, that file.
// The error lists every place it looked.
StatusOr<std::string> ResolveHubModel(const std::string& hub_id,
                                      const std::vector<std::string>& hub_dirs,
                                      const std::string& revision = "main");

}  // namespace kvq
