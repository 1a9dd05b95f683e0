// SHA-256 (FIPS 180-4), for verifying data files against their published
// checksums (e.g. the GSM8K split's SHA256SUMS). Not for secrets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvq {

// Lower-case hex digest of `data`.
std::string Sha256Hex(std::string_view data);

// The file's digest, read in one pass (errors name the file).
StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace kvq
