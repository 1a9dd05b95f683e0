#include "kv/prefix_index.h"

#include <algorithm>

namespace kvq {
namespace {

// splitmix64's finalizer: every input bit reaches every output bit, so
// chains that differ in one token get unrelated hashes.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t KvPrefixIndex::ChainHash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent ^ (static_cast<uint64_t>(tokens.size()) << 32));
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

BlockId KvPrefixIndex::Find(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const Entry& e = it->second;
  if (e.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end())) {
    return -1;
  }
  return e.block;
}

bool KvPrefixIndex::Insert(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                           BlockId block) {
  if (by_hash_.count(hash) != 0 || hash_of_.count(block) != 0) return false;
  by_hash_.emplace(hash, Entry{block, parent, std::vector<int32_t>(tokens.begin(), tokens.end())});
  hash_of_.emplace(block, hash);
  return true;
}

void KvPrefixIndex::Erase(BlockId block) {
  const auto it = hash_of_.find(block);
  if (it == hash_of_.end()) return;
  by_hash_.erase(it->second);
  hash_of_.erase(it);
}

}  // namespace kvq
