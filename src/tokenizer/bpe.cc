// BPE model: vocabulary and merge tables, and word encoding identical to HF tokenizers (see bpe.h).
#include "tokenizer/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <memory>
#include <queue>

#include "core/strings.h"
#include "tokenizer/utf8.h"

namespace tandem::tok {
namespace {

constexpr std::string_view kMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space
constexpr int kShortWord = 64;                        // symbols; longer words take the heap path

char32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  int len = 0;
  return utf8_decode(s, i, &len);
}

// A per-thread, direct-mapped cache of short segments ("▁the" -> [506]): one probe instead of a BPE run for the
// words that make up most text. Entries carry the owning model's serial so models never see each other's.
struct CachedSegment {
  uint64_t hash;
  uint32_t owner;  // model serial, 0 = empty
  uint8_t len;
  uint8_t n_ids;
  char text[26];
  int32_t ids[6];
};
static_assert(sizeof(CachedSegment) == 64);
constexpr size_t kCacheSlots = 1 << 15;  // 2 MiB per thread
std::atomic<uint32_t> g_model_serial{0};

CachedSegment* segment_cache() {
  thread_local std::unique_ptr<CachedSegment[]> cache;
  if (!cache) cache.reset(new CachedSegment[kCacheSlots]());
  return cache.get();
}

}  // namespace

void BpeModel::reserve(size_t n_vocab, size_t vocab_bytes, size_t n_merges) {
  vocab_.reserve(n_vocab, vocab_bytes);
  merges_.reserve(n_merges);
}

bool BpeModel::add_token(std::string_view token, int32_t id) { return vocab_.add(token, static_cast<uint32_t>(id)); }

Status BpeModel::add_merges(const std::vector<MergeText>& merges, uint32_t first_rank) {
  const size_t prefix = opts_.continuing_subword_prefix.size();
  merges_.reserve(merges_.size() + merges.size());
  constexpr size_t kBatch = 32;
  uint64_t ha[kBatch], hb[kBatch], hm[kBatch];
  int32_t ia[kBatch], ib[kBatch];
  std::string merged[kBatch];
  auto missing = [&](size_t k, std::string_view what) {
    const MergeText& m = merges[k];
    return corrupt(strfmt("merge %zu (\"%.*s\" \"%.*s\"): \"%.*s\" is not in the vocabulary", first_rank + k,
                          (int)m.a.size(), m.a.data(), (int)m.b.size(), m.b.data(), (int)what.size(), what.data()));
  };
  for (size_t base = 0; base < merges.size(); base += kBatch) {
    const size_t n = std::min(kBatch, merges.size() - base);
    for (size_t j = 0; j < n; ++j) {
      const MergeText& m = merges[base + j];
      ha[j] = hash_bytes(m.a.data(), m.a.size());
      hb[j] = hash_bytes(m.b.data(), m.b.size());
      vocab_.prefetch(ha[j]);
      vocab_.prefetch(hb[j]);
      if (m.b.size() < prefix) {
        return corrupt(strfmt("merge %zu: \"%.*s\" is shorter than the continuing-subword prefix",
                              first_rank + base + j, (int)m.b.size(), m.b.data()));
      }
      merged[j].assign(m.a).append(m.b.substr(prefix));
      hm[j] = hash_bytes(merged[j].data(), merged[j].size());
      vocab_.prefetch(hm[j]);
    }
    for (size_t j = 0; j < n; ++j) {
      const MergeText& m = merges[base + j];
      const int64_t xa = vocab_.find_hashed(m.a, ha[j]);
      if (xa < 0) return missing(base + j, m.a);
      const int64_t xb = vocab_.find_hashed(m.b, hb[j]);
      if (xb < 0) return missing(base + j, m.b);
      ia[j] = static_cast<int32_t>(vocab_.value(static_cast<size_t>(xa)));
      ib[j] = static_cast<int32_t>(vocab_.value(static_cast<size_t>(xb)));
      merges_.prefetch(ia[j], ib[j]);
    }
    for (size_t j = 0; j < n; ++j) {
      const MergeText& m = merges[base + j];
      const int64_t xm = vocab_.find_hashed(merged[j], hm[j]);
      if (xm < 0) {
        return corrupt(strfmt("merge %zu (\"%.*s\" \"%.*s\"): merged token \"%s\" is not in the vocabulary",
                              first_rank + base + j, (int)m.a.size(), m.a.data(), (int)m.b.size(), m.b.data(),
                              merged[j].c_str()));
      }
      merges_.put(ia[j], ib[j],
                  PairMap::Value{static_cast<uint32_t>(first_rank + base + j),
                                 static_cast<int32_t>(vocab_.value(static_cast<size_t>(xm)))});
      if (m.b.substr(0, kMarker.size()) == kMarker && !m.a.empty() && !ends_with(m.a, kMarker)) {
        join_before_marker_.push_back(last_char(m.a));
      }
    }
  }
  return ok_status();
}

Status BpeModel::finish() {
  if (vocab_.size() == 0) return corrupt("the BPE vocabulary is empty");
  int32_t max_id = -1;
  for (size_t i = 0; i < vocab_.size(); ++i) max_id = std::max(max_id, static_cast<int32_t>(vocab_.value(i)));
  index_of_id_.assign(static_cast<size_t>(max_id) + 1, -1);
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const auto id = static_cast<int32_t>(vocab_.value(i));
    if (index_of_id_[id] >= 0) {
      const std::string_view a = vocab_.str(static_cast<size_t>(index_of_id_[id])), b = vocab_.str(i);
      return corrupt(strfmt("vocabulary id %d is used by two tokens (\"%.*s\" and \"%.*s\")", id, (int)a.size(),
                            a.data(), (int)b.size(), b.data()));
    }
    index_of_id_[id] = static_cast<int32_t>(i);
  }
  const bool affixes = !opts_.continuing_subword_prefix.empty() || !opts_.end_of_word_suffix.empty();
  for (int c = 0; c < 128; ++c) {
    const char ch = static_cast<char>(c);
    ascii_id_[c] = affixes ? kNoId : token_to_id(std::string_view(&ch, 1));
  }
  have_all_bytes_ = true;
  for (int b = 0; b < 256; ++b) {
    byte_id_[b] = token_to_id(strfmt("<0x%02X>", b));
    if (byte_id_[b] == kNoId) have_all_bytes_ = false;
  }
  unk_id_ = opts_.unk_token ? token_to_id(*opts_.unk_token) : kNoId;
  std::sort(join_before_marker_.begin(), join_before_marker_.end());
  join_before_marker_.erase(std::unique(join_before_marker_.begin(), join_before_marker_.end()),
                            join_before_marker_.end());
  split_at_marker_ = !affixes && token_to_id(kMarker) != kNoId;
  serial_ = ++g_model_serial;
  return ok_status();
}

Status BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>* syms) const {
  syms->clear();
  int32_t unk = kNoId;  // pending unknown run (fused or not)
  uint32_t unk_len = 0;
  auto push = [&](int32_t id, uint32_t len) { syms->push_back(Symbol{id, -1, -1, len}); };
  std::string s;
  for (size_t i = 0; i < word.size();) {
    const auto b0 = static_cast<uint8_t>(word[i]);
    const int byte_len = utf8_seq_len(b0);
    const std::string_view ch = word.substr(i, static_cast<size_t>(byte_len));
    const bool first = i == 0;
    i += static_cast<size_t>(byte_len);
    const bool last = i >= word.size();
    int32_t id = kNoId;
    std::string_view key = ch;
    if (b0 < 0x80 && ascii_id_[b0] != kNoId) {
      id = ascii_id_[b0];
    } else {
      if ((!first && !opts_.continuing_subword_prefix.empty()) || (last && !opts_.end_of_word_suffix.empty())) {
        s.clear();
        if (!first) s.append(opts_.continuing_subword_prefix);
        s.append(ch);
        if (last) s.append(opts_.end_of_word_suffix);
        key = s;
      }
      id = token_to_id(key);
    }
    if (id != kNoId) {
      if (unk != kNoId) {
        push(unk, unk_len);
        unk = kNoId;
      }
      push(id, static_cast<uint32_t>(byte_len));
      continue;
    }
    if (opts_.byte_fallback) {
      bool all = true;
      for (char c : key) all = all && byte_id_[static_cast<uint8_t>(c)] != kNoId;
      if (all) {
        // As in HF, a pending unknown run is not flushed here: it lands after these bytes.
        for (char c : key) push(byte_id_[static_cast<uint8_t>(c)], 1);
        continue;
      }
    }
    if (opts_.unk_token) {
      if (unk_id_ == kNoId) {
        return corrupt(strfmt("the unknown token \"%s\" is not in the vocabulary", opts_.unk_token->c_str()));
      }
      if (unk != kNoId && opts_.fuse_unk) {
        unk_len += static_cast<uint32_t>(byte_len);
      } else {
        if (unk != kNoId) push(unk, unk_len);
        unk = unk_id_;
        unk_len = static_cast<uint32_t>(byte_len);
      }
    }
    // Without an unknown token, HF drops the character.
  }
  if (unk != kNoId) push(unk, unk_len);
  return ok_status();
}

void BpeModel::merge_short(const PairMap& merges, std::vector<Symbol>* syms) {
  int n = static_cast<int>(syms->size());
  if (n < 2) return;
  int32_t ids[kShortWord];
  uint32_t rank[kShortWord];
  int32_t merged[kShortWord];
  for (int i = 0; i < n; ++i) ids[i] = (*syms)[i].id;
  auto pair_at = [&](int i) {
    const PairMap::Value* v = merges.find(ids[i], ids[i + 1]);
    rank[i] = v ? v->rank : UINT32_MAX;
    merged[i] = v ? v->new_id : -1;
  };
  for (int i = 0; i + 1 < n; ++i) pair_at(i);
  while (n > 1) {
    uint32_t best = UINT32_MAX;
    int bi = -1;
    for (int i = 0; i + 1 < n; ++i) {
      if (rank[i] < best) {
        best = rank[i];
        bi = i;
      }
    }
    if (bi < 0) break;
    ids[bi] = merged[bi];
    for (int j = bi + 1; j + 1 < n; ++j) ids[j] = ids[j + 1];
    for (int j = bi; j + 2 < n; ++j) {
      rank[j] = rank[j + 1];
      merged[j] = merged[j + 1];
    }
    --n;
    if (bi > 0) pair_at(bi - 1);
    if (bi + 1 < n) pair_at(bi);
  }
  syms->resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) (*syms)[i].id = ids[i];
}

void BpeModel::merge_heap(const PairMap& merges, std::vector<Symbol>* syms) {
  struct Merge {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  // Lowest rank first, then leftmost position (HF's Merge ordering).
  auto later = [](const Merge& a, const Merge& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
  std::vector<Symbol>& s = *syms;
  const int n = static_cast<int>(s.size());
  for (int i = 0; i < n; ++i) {
    s[i].prev = i - 1;
    s[i].next = i + 1 < n ? i + 1 : -1;
  }
  for (int i = 0; i + 1 < n; ++i) {
    if (const PairMap::Value* v = merges.find(s[i].id, s[i + 1].id)) queue.push(Merge{v->rank, i, v->new_id});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& left = s[top.pos];
    if (left.len == 0 || left.next == -1) continue;
    const int right_pos = left.next;
    Symbol& right = s[right_pos];
    const PairMap::Value* v = merges.find(left.id, right.id);
    if (v == nullptr || v->new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next != -1) s[left.next].prev = top.pos;
    if (left.prev != -1) {
      if (const PairMap::Value* p = merges.find(s[left.prev].id, left.id)) {
        queue.push(Merge{p->rank, left.prev, p->new_id});
      }
    }
    if (left.next != -1) {
      if (const PairMap::Value* p = merges.find(left.id, s[left.next].id))
        queue.push(Merge{p->rank, top.pos, p->new_id});
    }
  }
  size_t w = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].len != 0) s[w++] = s[i];
  }
  s.resize(w);
}

Status BpeModel::encode_segment(std::string_view seg, std::vector<int32_t>* ids) const {
  CachedSegment* slot = nullptr;
  uint64_t h = 0;
  if (seg.size() <= sizeof(CachedSegment::text)) {
    h = hash_bytes(seg.data(), seg.size());
    slot = &segment_cache()[h & (kCacheSlots - 1)];
    if (slot->owner == serial_ && slot->hash == h && slot->len == seg.size() &&
        std::memcmp(slot->text, seg.data(), seg.size()) == 0) {
      ids->insert(ids->end(), slot->ids, slot->ids + slot->n_ids);
      return ok_status();
    }
  }
  thread_local std::vector<Symbol> syms;
  TANDEM_TRY(initial_symbols(seg, &syms));
  if (syms.size() <= static_cast<size_t>(kShortWord)) {
    merge_short(merges_, &syms);
  } else {
    merge_heap(merges_, &syms);
  }
  for (const Symbol& s : syms) ids->push_back(s.id);
  if (slot != nullptr && syms.size() <= std::size(slot->ids)) {
    slot->hash = h;
    slot->owner = serial_;
    slot->len = static_cast<uint8_t>(seg.size());
    slot->n_ids = static_cast<uint8_t>(syms.size());
    std::memcpy(slot->text, seg.data(), seg.size());
    for (size_t i = 0; i < syms.size(); ++i) slot->ids[i] = syms[i].id;
  }
  return ok_status();
}

Status BpeModel::encode_word(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return ok_status();
  if (opts_.ignore_merges) {
    const int32_t id = token_to_id(word);
    if (id != kNoId) {
      ids->push_back(id);
      return ok_status();
    }
  }
  if (!split_at_marker_) return encode_segment(word, ids);
  size_t start = 0;
  size_t prev = 0;  // start of the previous character
  for (size_t i = 0; i < word.size();) {
    const int len = utf8_seq_len(static_cast<uint8_t>(word[i]));
    if (i > 0 && word.compare(i, kMarker.size(), kMarker) == 0) {
      const std::string_view pc = word.substr(prev, i - prev);
      bool cut = pc != kMarker;
      if (cut) {
        const auto b0 = static_cast<uint8_t>(pc[0]);
        cut = b0 < 0x80 ? ascii_id_[b0] != kNoId : token_to_id(pc) != kNoId;
      }
      if (cut && !join_before_marker_.empty()) {
        int l = 0;
        const char32_t c = utf8_decode(pc, 0, &l);
        cut = !std::binary_search(join_before_marker_.begin(), join_before_marker_.end(), c);
      }
      if (cut) {
        TANDEM_TRY(encode_segment(word.substr(start, i - start), ids));
        start = i;
      }
    }
    prev = i;
    i += static_cast<size_t>(len);
  }
  return encode_segment(word.substr(start), ids);
}

}  // namespace tandem::tok
