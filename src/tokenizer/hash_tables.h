// Open-addressing hash tables for the tokenizer's hot lookups: token string -> id over one string arena
// (262k Gemma tokens load in milliseconds) and (left id, right id) -> (merge rank, merged id) for BPE.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tok {

// 64-bit hash of a short byte string (multiply-xor mixing, 8 bytes per step).
[[nodiscard]] inline uint64_t hash_bytes(const char* p, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0x2545F4914F6CDD1Dull ^ (n * kMul);
  auto mix = [](uint64_t a, uint64_t b) {
    const __uint128_t r = static_cast<__uint128_t>(a) * b;
    return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
  };
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix(h ^ w, kMul);
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  return mix(h ^ w ^ 0xFF51AFD7ED558CCDull, kMul);
}

// Strings stored back to back in one arena, each with a uint32 value, findable by content. Insertion order is
// the string index. Duplicate contents are rejected by add().
class StringTable {
 public:
  void reserve(size_t n, size_t bytes) {
    arena_.reserve(bytes);
    offsets_.reserve(n + 1);
    values_.reserve(n);
    rehash(capacity_for(n));
  }
  // Returns false (and adds nothing) if `s` is already present.
  bool add(std::string_view s, uint32_t value) {
    if ((size() + 1) * 2 > slots_.size()) rehash(capacity_for(size() + 1) * 2);
    const uint64_t h = hash_bytes(s.data(), s.size());
    size_t i = (h >> 32) & mask_;
    while (slots_[i].index1 != 0) {
      if (slots_[i].hash == static_cast<uint32_t>(h) && str(slots_[i].index1 - 1) == s) return false;
      i = (i + 1) & mask_;
    }
    if (offsets_.empty()) offsets_.push_back(0);
    arena_.append(s);
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
    values_.push_back(value);
    slots_[i] = Slot{static_cast<uint32_t>(h), static_cast<uint32_t>(values_.size())};
    return true;
  }
  // Index of `s`, or -1.
  [[nodiscard]] int64_t find(std::string_view s) const { return find_hashed(s, hash_bytes(s.data(), s.size())); }
  // Hints the cache about the slot a later find_hashed(_, h) reads first (batched lookups overlap misses).
  void prefetch(uint64_t h) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[(h >> 32) & mask_]);
  }
  // find() with the hash already computed by hash_bytes().
  [[nodiscard]] int64_t find_hashed(std::string_view s, uint64_t h) const {
    if (slots_.empty()) return -1;
    size_t i = (h >> 32) & mask_;
    while (slots_[i].index1 != 0) {
      if (slots_[i].hash == static_cast<uint32_t>(h) && str(slots_[i].index1 - 1) == s) return slots_[i].index1 - 1;
      i = (i + 1) & mask_;
    }
    return -1;
  }
  [[nodiscard]] size_t size() const { return values_.size(); }
  [[nodiscard]] std::string_view str(size_t index) const {
    return std::string_view(arena_).substr(offsets_[index], offsets_[index + 1] - offsets_[index]);
  }
  [[nodiscard]] uint32_t value(size_t index) const { return values_[index]; }

 private:
  static size_t capacity_for(size_t n) {
    size_t c = 16;
    while (c < n * 2) c <<= 1;
    return c;
  }
  void rehash(size_t cap) {
    if (cap <= slots_.size()) return;
    slots_.assign(cap, Slot{0, 0});
    mask_ = cap - 1;
    for (size_t k = 0; k < values_.size(); ++k) {
      const std::string_view s = str(k);
      const uint64_t h = hash_bytes(s.data(), s.size());
      size_t i = (h >> 32) & mask_;
      while (slots_[i].index1 != 0) i = (i + 1) & mask_;
      slots_[i] = Slot{static_cast<uint32_t>(h), static_cast<uint32_t>(k + 1)};
    }
  }
  std::string arena_;
  std::vector<uint32_t> offsets_;  // [n + 1] byte offsets into arena_
  std::vector<uint32_t> values_;   // [n]
  struct Slot {
    uint32_t hash;    // low 32 bits of the string's hash (the slot comes from the high bits)
    uint32_t index1;  // string index + 1, 0 = empty
  };
  std::vector<Slot> slots_;  // [capacity]
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id). Inserting an existing pair overwrites it (later merges win, as when
// HF collects the merges list into its map).
class PairMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n) { rehash(capacity_for(n)); }
  void put(int32_t a, int32_t b, Value v) {
    if ((size_ + 1) * 2 > entries_.size()) rehash(capacity_for(size_ + 1) * 2);
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (entries_[i].key != kEmpty) {
      if (entries_[i].key == k) {
        entries_[i].value = v;
        return;
      }
      i = (i + 1) & mask_;
    }
    entries_[i] = Entry{k, v};
    ++size_;
  }
  void prefetch(int32_t a, int32_t b) const {
    if (!entries_.empty()) __builtin_prefetch(&entries_[slot(key(a, b))]);
  }
  [[nodiscard]] const Value* find(int32_t a, int32_t b) const {
    if (size_ == 0) return nullptr;
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (entries_[i].key != kEmpty) {
      if (entries_[i].key == k) return &entries_[i].value;
      i = (i + 1) & mask_;
    }
    return nullptr;
  }
  [[nodiscard]] size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t k) const {
    const __uint128_t r = static_cast<__uint128_t>(k ^ 0x9E3779B97F4A7C15ull) * 0xD6E8FEB86659FD93ull;
    return (static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64)) & mask_;
  }
  static size_t capacity_for(size_t n) {
    size_t c = 16;
    while (c < n * 2) c <<= 1;
    return c;
  }
  void rehash(size_t cap) {
    if (cap <= entries_.size()) return;
    std::vector<Entry> old = std::move(entries_);
    entries_.assign(cap, Entry{kEmpty, Value{0, 0}});
    mask_ = cap - 1;
    for (const Entry& e : old) {
      if (e.key == kEmpty) continue;
      size_t i = slot(e.key);
      while (entries_[i].key != kEmpty) i = (i + 1) & mask_;
      entries_[i] = e;
    }
  }
  struct Entry {
    uint64_t key;  // packed (a, b), kEmpty = free
    Value value;
  };
  std::vector<Entry> entries_;  // [capacity]
  size_t size_ = 0;
  size_t mask_ = 0;
};

}  // namespace tandem::tok
