// Strict JSON parsing (see json_util.h): duplicate keys and deep nesting are reported, never silently accepted.
#include "io/json_util.h"

#include <unordered_set>
#include <vector>

#include "core/strings.h"

namespace tandem {
namespace {

struct JsonReject {
  std::string why;
};

}  // namespace

Result<nlohmann::json> parse_json_strict(std::string_view text, const std::string& source) {
  using nlohmann::json;
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  int depth = 0;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start: keys.emplace_back(); [[fallthrough]];
      case json::parse_event_t::array_start:
        if (++depth > kMaxJsonDepth) throw JsonReject{strfmt("nesting deeper than %d levels", kMaxJsonDepth)};
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        [[fallthrough]];
      case json::parse_event_t::array_end: --depth; break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() && !keys.back().insert(parsed.get<std::string>()).second) {
          throw JsonReject{strfmt("duplicate key \"%s\"", parsed.get<std::string>().c_str())};
        }
        break;
      case json::parse_event_t::value: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const JsonReject& r) {
    return corrupt(strfmt("%s: invalid JSON: %s", source.c_str(), r.why.c_str()));
  } catch (const json::exception& e) {
    return corrupt(strfmt("%s: invalid JSON: %s", source.c_str(), e.what()));
  }
}

const char* json_kind(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::object: return "object";
    case nlohmann::json::value_t::array: return "array";
    case nlohmann::json::value_t::string: return "string";
    case nlohmann::json::value_t::boolean: return "boolean";
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "integer";
    case nlohmann::json::value_t::number_float: return "number";
    default: return "value";
  }
}

}  // namespace tandem
