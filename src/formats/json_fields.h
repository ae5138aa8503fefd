// Strict typed access to the fields of a JSON object, for every file format Stratum parses:
// each failure (missing field, wrong type, out of range, not finite) is one line naming the
// component, the file and the field, e.g. "[checkpoint] 'dir/trainer_state.json': field 'batch'
// is 0, outside [1, 65536]". Integers >= 0 arrive from nlohmann as unsigned and are range-checked
// at both ends (found by fuzzing). Does not parse: the caller holds the parsed object.
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
  JsonFields(const nlohmann::json& object, std::string where, std::string component)
      : object_(object), where_(std::move(where)), prefix_("[" + std::move(component) + "] ") {}

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
  std::uint64_t hex(const char* key) const {
    const std::string text = str(key);
    STRATUM_CHECK(text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos,
                  prefix_, where_, ": field '", key, "' must be 16 lowercase hex digits, got '",
                  text.substr(0, 40), "'");
    return std::strtoull(text.c_str(), nullptr, 16);
  }

 private:
  const nlohmann::json& object_;
  std::string where_;
  std::string prefix_;
};

}  // namespace stratum
