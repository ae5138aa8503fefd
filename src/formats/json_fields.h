// Strict typed access to the fields of a JSON file, for every format Stratum parses (trainer
// state, manifest, option table, config.json, calibration cache, tokenizer.json): each failure
// (missing field, wrong type, out of range, not finite) is one line naming the component, the
// file and the field, e.g. "[checkpoint] 'dir/trainer_state.json': field 'batch' is 0, outside
// [1, 65536]". Two ways in: the fields of one bound object (at, str, number, integer, boolean,
// hex), or, for nested files, any object at a dotted path ("model", "pre_tokenizer.pretokenizers[0]":
// required, object, string, boolean with a fallback, type, expect). Integers >= 0 arrive from
// nlohmann as unsigned and are range-checked at both ends (found by fuzzing). Does not parse:
// the caller holds the parsed JSON.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "formats/json_brief.h"
#include "stratum/error.h"

namespace stratum {

class JsonFields {
 public:
  // component: the error prefix without brackets ("checkpoint"); where: the file (and position).
  // hint: appended to every failure (what to do about it), e.g. ": use the file that came with the model".
  JsonFields(const nlohmann::json& object, std::string where, std::string component, std::string hint = "")
      : object_(object), where_(std::move(where)), prefix_("[" + std::move(component) + "] "), hint_(std::move(hint)) {}
  // For nested access only (no bound object).
  JsonFields(std::string where, std::string component, std::string hint = "")
      : JsonFields(empty_object(), std::move(where), std::move(component), std::move(hint)) {}

  const std::string& file() const { return where_; }

  bool has(const char* key) const { return object_.find(key) != object_.end(); }
  const nlohmann::json& at(const char* key) const {
    auto it = object_.find(key);
    STRATUM_CHECK(it != object_.end(), prefix_, where_, ": field '", key, "' is missing");
    return *it;
  }
  std::string str(const char* key) const {
    const nlohmann::json& v = at(key);
    STRATUM_CHECK(v.is_string(), prefix_, where_, ": field '", key, "' must be a string, got ", json_brief(v));
    return v.get<std::string>();
  }
  // An optional string: `fallback` when the key is absent (a field added in a later version).
  std::string str_or(const char* key, const std::string& fallback) const {
    return object_.find(key) == object_.end() ? fallback : str(key);
  }
  double number(const char* key, double min, double max) const {
    const nlohmann::json& v = at(key);
    STRATUM_CHECK(v.is_number(), prefix_, where_, ": field '", key, "' must be a number, got ", json_brief(v));
    const double x = v.get<double>();
    STRATUM_CHECK(std::isfinite(x) && x >= min && x <= max, prefix_, where_, ": field '", key, "' is ", x,
                  ", outside [", min, ", ", max, "]");
    return x;
  }
  // An optional finite number: `fallback` when the key is absent or null.
  double number_or(const char* key, double fallback) const {
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return fallback;
    return number(key, -std::numeric_limits<double>::max(), std::numeric_limits<double>::max());
  }
  std::int64_t integer(const char* key, std::int64_t min, std::int64_t max) const {
    const nlohmann::json& v = at(key);
    STRATUM_CHECK(v.is_number_integer(), prefix_, where_, ": field '", key, "' must be an integer, got ",
                  json_brief(v));
    if (v.is_number_unsigned()) {
      const std::uint64_t u = v.get<std::uint64_t>();
      // JSON integers >= 0 arrive as unsigned: both bounds apply here too (fuzzing found 0 accepted
      // where the minimum is 1).
      STRATUM_CHECK(u <= static_cast<std::uint64_t>(max) && static_cast<std::int64_t>(u) >= min, prefix_,
                    where_, ": field '", key, "' is ", u, ", outside [", min, ", ", max, "]");
      return static_cast<std::int64_t>(u);
    }
    const std::int64_t x = v.get<std::int64_t>();
    STRATUM_CHECK(x >= min && x <= max, prefix_, where_, ": field '", key, "' is ", x, ", outside [", min,
                  ", ", max, "]");
    return x;
  }
  bool boolean(const char* key) const {
    const nlohmann::json& v = at(key);
    STRATUM_CHECK(v.is_boolean(), prefix_, where_, ": field '", key, "' must be true or false, got ",
                  json_brief(v));
    return v.get<bool>();
  }
  // Fails with "field 'key' <problem>" unless ok (a check the typed readers do not cover).
  void check(bool ok, const char* key, const char* problem) const {
    STRATUM_CHECK(ok, prefix_, where_, ": field '", key, "' ", problem);
  }
  // Nested access: obj is the object at dotted path `where` in the file.
  static const nlohmann::json* find(const nlohmann::json& obj, const char* key) {
    const auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  const nlohmann::json& required(const nlohmann::json& obj, const std::string& where, const char* key) const {
    const nlohmann::json* value = find(obj, key);
    STRATUM_CHECK(value != nullptr, prefix_, where_, ": ", where, " has no \"", key, "\" field", hint_);
    return *value;
  }
  const nlohmann::json& object(const nlohmann::json& obj, const std::string& where, const char* key) const {
    const nlohmann::json& value = required(obj, where, key);
    expect(value.is_object(), value, join(where, key), "an object");
    return value;
  }
  std::string string(const nlohmann::json& obj, const std::string& where, const char* key) const {
    const nlohmann::json& value = required(obj, where, key);
    expect(value.is_string(), value, join(where, key), "a string");
    return value.get<std::string>();
  }
  // obj[key] as a bool; `fallback` when absent (required when fallback is -1).
  bool boolean(const nlohmann::json& obj, const std::string& where, const char* key, int fallback) const {
    const nlohmann::json* found = find(obj, key);
    if (found == nullptr && fallback >= 0) return fallback != 0;
    const nlohmann::json& value = found != nullptr ? *found : required(obj, where, key);
    expect(value.is_boolean(), value, join(where, key), "true or false");
    return value.get<bool>();
  }
  // The "type" of a component object such as {"type": "ByteLevel", ...}.
  std::string type(const nlohmann::json& component, const std::string& where) const {
    expect(component.is_object(), component, where, "an object");
    return string(component, where, "type");
  }
  // Fails with "<where> must be <expected>, got <its JSON type>" unless ok.
  void expect(bool ok, const nlohmann::json& value, const std::string& where, const char* expected) const {
    STRATUM_CHECK(ok, prefix_, where_, ": ", where, " must be ", expected, ", got ",
                  value.is_null() ? "null" : std::string("a ") + value.type_name(), hint_);
  }
  static std::string join(const std::string& where, const char* key) {
    return where.empty() ? std::string(key) : where + "." + key;
  }
  static std::string index(const std::string& where, std::size_t i) { return where + "[" + std::to_string(i) + "]"; }

  std::uint64_t hex(const char* key) const {
    const std::string text = str(key);
    STRATUM_CHECK(text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos,
                  prefix_, where_, ": field '", key, "' must be 16 lowercase hex digits, got '",
                  text.substr(0, 40), "'");
    return std::strtoull(text.c_str(), nullptr, 16);
  }

 private:
  static const nlohmann::json& empty_object() {
    static const nlohmann::json empty = nlohmann::json::object();
    return empty;
  }
  const nlohmann::json& object_;
  std::string where_;
  std::string prefix_;
  std::string hint_;
};

}  // namespace stratum
