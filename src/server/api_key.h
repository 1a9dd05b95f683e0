// The API key: compared in constant time, read from a file so it need not
// appear on a command line (visible in ps and shell history).
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace kvq {

// Equality whose time depends only on the lengths, not on where the
// contents differ, so response times do not reveal a key's prefix.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The key in `path`: one line of visible characters (a final newline is
// allowed), at most 4 KiB. Errors name the file, never its content.
StatusOr<std::string> ReadApiKeyFile(const std::string& path);

}  // namespace kvq
