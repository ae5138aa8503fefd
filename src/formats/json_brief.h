// A short, non-recursive description of a JSON value for error messages: scalars as JSON
// (cut to 60 characters), a short array of scalars as itself ("[2, -1]"), other arrays and
// objects as their type and size. Never calls dump() on a
// container, so a hostile, deeply nested value cannot overflow the stack (found by fuzzing).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace stratum {

inline std::string json_brief(const nlohmann::json& v) {
  if (v.is_array()) {
    // A short flat array (a shape, data offsets) is shown as it is: "[2, -1]", not its size.
    std::string text = "[";
    bool flat = v.size() <= 8;
    for (std::size_t i = 0; flat && i < v.size(); ++i) {
      flat = !v[i].is_structured();
      if (flat) text += (i > 0 ? ", " : "") + v[i].dump();  // a scalar: no recursion
    }
    if (flat && text.size() < 60) return text + "]";
    return "an array of " + std::to_string(v.size()) + " element(s)";
  }
  if (v.is_object()) return "an object with " + std::to_string(v.size()) + " key(s)";
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

}  // namespace stratum
