// Tokenizer benchmark (issue 5 targets: load the 262k-token Gemma tokenizer.json in under 1 s, encode at least
// 5 MB/s of English on one core). Measures load time (best and median of several loads), encode throughput on
// deterministic English-like text (first pass with the per-thread word cache cold, then warm), and one-shot and
// streaming decode. --results appends the numbers to bench/RESULTS.md (date | machine | command | number).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/strings.h"
#include "tokenizer/tokenizer.h"

namespace {

using tandem::strfmt;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string machine() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line)) {
    if (tandem::starts_with(line, "model name")) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return strfmt("%s, %u cores", model.c_str(), std::thread::hardware_concurrency());
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

// Deterministic English-like text: common words with a Zipf-like draw over a 6000-word vocabulary (real words
// first, then pronounceable made-up ones, so rare words keep missing the cache), sentences, paragraphs.
std::string english_like(size_t bytes) {
  static const char* kWords[] = {
      "the",      "of",        "and",     "to",          "in",        "a",          "is",      "that",
      "for",      "it",        "as",      "was",         "with",      "be",         "by",      "on",
      "not",      "he",        "this",    "are",         "or",        "his",        "from",    "at",
      "which",    "but",       "have",    "an",          "had",       "they",       "you",     "were",
      "their",    "one",       "all",     "we",          "can",       "her",        "has",     "there",
      "been",     "if",        "more",    "when",        "will",      "would",      "who",     "so",
      "no",       "time",      "people",  "year",        "way",       "day",        "man",     "thing",
      "woman",    "life",      "child",   "world",       "school",    "state",      "family",  "student",
      "group",    "country",   "problem", "hand",        "part",      "place",      "case",    "week",
      "company",  "system",    "program", "question",    "work",      "government", "number",  "night",
      "point",    "home",      "water",   "room",        "mother",    "area",       "money",   "story",
      "fact",     "month",     "lot",     "right",       "study",     "book",       "eye",     "job",
      "word",     "business",  "issue",   "side",        "kind",      "head",       "house",   "service",
      "friend",   "father",    "power",   "hour",        "game",      "line",       "end",     "member",
      "law",      "car",       "city",    "community",   "name",      "president",  "team",    "minute",
      "idea",     "kid",       "body",    "information", "back",      "parent",     "face",    "others",
      "level",    "office",    "door",    "health",      "person",    "art",        "war",     "history",
      "party",    "result",    "change",  "morning",     "reason",    "research",   "girl",    "guy",
      "moment",   "air",       "teacher", "force",       "education", "good",       "new",     "first",
      "last",     "long",      "great",   "little",      "own",       "other",      "old",     "big",
      "high",     "different", "small",   "large",       "next",      "early",      "young",   "important",
      "few",      "public",    "bad",     "same",        "able",      "said",       "made",    "went",
      "found",    "thought",   "told",    "became",      "showed",    "brought",    "however", "therefore",
      "although", "because",   "through", "between",     "without",   "against",    "during"};
  const size_t n_real = sizeof(kWords) / sizeof(kWords[0]);
  static const char* kSyl[] = {"ka",  "ro",   "ten", "mi",   "sa",  "lo", "ver", "den", "ta", "ri", "con", "pro",
                               "ble", "tion", "al",  "ment", "ing", "er", "an",  "st",  "qu", "ph", "ex",  "ly"};
  std::vector<std::string> vocab(kWords, kWords + n_real);
  uint64_t s = 0x243F6A8885A308D3ull;
  auto next = [&s]() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  while (vocab.size() < 6000) {
    std::string w;
    const int k = 2 + static_cast<int>(next() % 3);
    for (int i = 0; i < k; ++i) w += kSyl[next() % (sizeof(kSyl) / sizeof(kSyl[0]))];
    vocab.push_back(w);
  }
  // Zipf-like: rank = floor(6000^u) - 1 for uniform u.
  auto draw = [&]() -> const std::string& {
    const double u = static_cast<double>(next() % 1000000) / 1e6;
    size_t r = static_cast<size_t>(std::pow(6000.0, u)) - 1;
    return vocab[std::min(r, vocab.size() - 1)];
  };
  std::string text;
  text.reserve(bytes + 256);
  while (text.size() < bytes) {
    const int sentences = 2 + static_cast<int>(next() % 6);
    for (int k = 0; k < sentences; ++k) {
      const int words = 5 + static_cast<int>(next() % 20);
      for (int i = 0; i < words; ++i) {
        std::string w = draw();
        if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
        text += w;
        if (i + 1 < words) text += (next() % 12 == 0) ? ", " : " ";
      }
      static const char* kEnd[] = {". ", ". ", ". ", "? ", "! ", "; "};
      text += kEnd[next() % 6];
    }
    text += "\n\n";
  }
  return text;
}

struct Report {
  std::string command, results_path;
  std::vector<std::string> lines;
  void add(const std::string& what) {
    std::printf("%s\n", what.c_str());
    std::fflush(stdout);
    lines.push_back(what);
  }
  void flush() const {
    if (results_path.empty()) return;
    std::ifstream probe(results_path);
    const bool fresh = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
    std::ofstream out(results_path, std::ios::app);
    if (fresh) out << "# Measured numbers: one line each, `- date | machine | command | number`\n\n";
    const std::string prefix = strfmt("%s | %s | `%s` | ", today().c_str(), machine().c_str(), command.c_str());
    for (const auto& l : lines) out << "- " << prefix << l << "\n";
    std::printf("appended %zu lines to %s\n", lines.size(), results_path.c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandem_bench_tokenizer: tokenizer.json load time and single-core encode/decode throughput"};
  std::string path = TANDEM_SOURCE_DIR "/.cache/tokenizer-gemma3/tokenizer.json";
  std::string text_file, results;
  double mb = 8;
  int loads = 5, passes = 3;
  app.add_option("--tokenizer", path, "tokenizer.json or a checkpoint directory");
  app.add_option("--text", text_file, "encode this file instead of generated English-like text");
  app.add_option("--mb", mb, "megabytes of generated text");
  app.add_option("--loads", loads, "timed loads (best and median reported)");
  app.add_option("--passes", passes, "timed encode passes after the cold one");
  app.add_option("--results", results, "append the numbers to this file (bench/RESULTS.md)");
  CLI11_PARSE(app, argc, argv);
  std::string command = "tandem_bench_tokenizer";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  Report rep{.command = command, .results_path = results};
  std::printf("machine: %s\n", machine().c_str());

  std::vector<double> load_s;
  std::unique_ptr<tandem::tok::Tokenizer> tok;
  for (int i = 0; i < std::max(1, loads); ++i) {
    const auto t0 = Clock::now();
    auto t = tandem::tok::Tokenizer::load(path);
    load_s.push_back(seconds_since(t0));
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().to_string().c_str());
      return 1;
    }
    tok = std::move(t).value();
  }
  std::sort(load_s.begin(), load_s.end());
  rep.add(strfmt("tokenizer load (%zu tokens, %zu merges): best %.3f s, median %.3f s of %zu",
                 tok->model().vocab_size(), tok->model().merge_count(), load_s.front(), load_s[load_s.size() / 2],
                 load_s.size()));

  std::string text;
  std::string source;
  if (!text_file.empty()) {
    std::ifstream f(text_file, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
    source = text_file;
  } else {
    text = english_like(static_cast<size_t>(mb * 1e6));
    source = "generated English-like text";
  }
  const double mbytes = static_cast<double>(text.size()) / 1e6;

  auto t0 = Clock::now();
  auto ids = tok->encode(text, {.add_special_tokens = false});
  const double cold = seconds_since(t0);
  if (!ids.ok()) {
    std::fprintf(stderr, "%s\n", ids.status().to_string().c_str());
    return 1;
  }
  double warm = 1e30;
  for (int p = 0; p < passes; ++p) {
    t0 = Clock::now();
    auto again = tok->encode(text, {.add_special_tokens = false});
    warm = std::min(warm, seconds_since(t0));
  }
  rep.add(strfmt("encode %.1f MB of %s, 1 thread: %.1f MB/s first pass, %.1f MB/s warm (%zu tokens, %.2f bytes/token)",
                 mbytes, source.c_str(), mbytes / cold, mbytes / warm, ids->size(),
                 static_cast<double>(text.size()) / static_cast<double>(ids->size())));

  t0 = Clock::now();
  const std::string back = tok->decode(*ids);
  const double dec = seconds_since(t0);
  t0 = Clock::now();
  tandem::tok::StreamDecoder sd = tok->stream_decoder();
  std::string streamed;
  for (int32_t id : *ids) sd.push(id, &streamed);
  sd.finish(&streamed);
  const double sdec = seconds_since(t0);
  if (back != text || streamed != text) {
    std::fprintf(stderr, "decode does not round-trip the benchmark text\n");
    return 1;
  }
  rep.add(strfmt("decode %zu tokens, 1 thread: %.1f MB/s one-shot, %.1f MB/s streamed one id at a time", ids->size(),
                 mbytes / dec, mbytes / sdec));
  rep.flush();
  return 0;
}
