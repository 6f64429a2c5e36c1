// `tandem tokenize --tokenizer PATH (--text T | --file F) [--json] [--no-special]`: encodes text with a
// Hugging Face tokenizer.json (a file, or a checkpoint directory holding one) and prints the ids, either as
// JSON {"ids": [...], "tokens": [...]} or as a table of index, id and token. Exit 1 on errors, 2 on usage.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "core/strings.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  std::string file;
  bool json = false;
  bool no_special = false;
};

Result<std::string> read_input(const std::string& path) {
  FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (f == nullptr) return not_found(strfmt("%s: cannot open", path.c_str()));
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  if (f != stdin) std::fclose(f);
  if (failed) return io_error(strfmt("%s: read error", path.c_str()));
  return data;
}

// A token for the table: control characters, backslashes and quotes escaped, everything else as is.
std::string printable(std::string_view s) {
  std::string r;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n')
      r += "\\n";
    else if (c == '\t')
      r += "\\t";
    else if (c == '\r')
      r += "\\r";
    else if (c == '\\')
      r += "\\\\";
    else if (u < 0x20 || u == 0x7F)
      r += strfmt("\\x%02X", u);
    else
      r.push_back(c);
  }
  return r;
}

Status run_tokenize(const TokenizeOptions& o) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<tok::Tokenizer> t, tok::Tokenizer::load(o.tokenizer));
  std::string text = o.text;
  if (!o.file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(text, read_input(o.file));
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, t->encode(text, {.add_special_tokens = !o.no_special}));
  if (o.json) {
    nlohmann::json j;
    j["ids"] = ids;
    j["tokens"] = nlohmann::json::array();
    for (int32_t id : ids) j["tokens"].push_back(std::string(t->id_to_token(id).value_or("")));
    std::printf("%s\n", j.dump().c_str());
    return ok_status();
  }
  std::printf("%6s  %7s  %s\n", "index", "id", "token");
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string tokstr = printable(t->id_to_token(ids[i]).value_or(""));
    std::printf("%6zu  %7d  %s%s\n", i, ids[i], tokstr.c_str(), t->is_special(ids[i]) ? "  (special)" : "");
  }
  std::printf("%zu tokens, %zu bytes\n", ids.size(), text.size());
  return ok_status();
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("tokenize", "Encode text with a checkpoint's tokenizer and print the token ids");
  auto opts = std::make_shared<TokenizeOptions>();
  // Usage is checked in the callback (not with CLI11's required/excludes) so that usage errors exit with 2.
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "tokenizer.json, or a checkpoint directory containing one (required)");
  auto* text = cmd->add_option("--text", opts->text, "Text to encode");
  auto* file = cmd->add_option("--file", opts->file, "File whose contents to encode (- for stdin)");
  cmd->add_flag("--json", opts->json, "Print {\"ids\": [...], \"tokens\": [...]}");
  cmd->add_flag("--no-special", opts->no_special, "Do not add the post-processor's special tokens (e.g. <bos>)");
  cmd->footer("Example: tandem tokenize --tokenizer models/gemma-4-E2B-it --text 'Hello world' --json");
  cmd->callback([&exit_code, opts, text, file] {
    const char* usage = nullptr;
    if (opts->tokenizer.empty())
      usage = "--tokenizer is required";
    else if (text->count() == 0 && file->count() == 0)
      usage = "one of --text or --file is required";
    else if (text->count() > 0 && file->count() > 0)
      usage = "--text and --file cannot be used together";
    if (usage != nullptr) {
      std::fprintf(stderr, "tandem tokenize: %s (see tandem tokenize --help)\n", usage);
      exit_code = 2;
      return;
    }
    Status s = run_tokenize(*opts);
    if (!s.ok()) {
      std::fprintf(stderr, "tandem tokenize: %s\n", s.to_string().c_str());
      exit_code = 1;
    }
  });
}

}  // namespace tandem::cli
