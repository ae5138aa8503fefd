// The malformed-file check both tokenizer.json test files run (byte-level and SentencePiece-
// style): each case breaks a valid tokenizer.json and loading it must fail with one line that
// starts "[tokenizer] ", names the file and holds the case's fragment (never an internal error).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "data/bpe_tokenizer.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum::testing {

// One malformed tokenizer.json: `mutate` breaks the valid one (or `raw` replaces it), and the
// error must contain `fragment`.
struct MalformedCase {
  const char* name;
  std::function<void(nlohmann::json&)> mutate;
  const char* fragment;
  const char* raw = nullptr;
};

inline void expect_malformed_refused(const nlohmann::json& valid, const std::vector<MalformedCase>& cases) {
  for (const MalformedCase& c : cases) {
    TempDir dir;
    nlohmann::json json = valid;
    if (c.mutate) c.mutate(json);
    file_write_atomic(dir.file("tokenizer.json"), c.raw != nullptr ? std::string(c.raw) : json.dump());
    try {
      BpeTokenizer::load(dir.path());
      ADD_FAILURE() << c.name << ": load did not throw";
    } catch (const BugError& e) {
      ADD_FAILURE() << c.name << ": internal error " << e.what();
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("[tokenizer] ", 0), 0u) << c.name << ": " << message;
      EXPECT_NE(message.find(c.fragment), std::string::npos) << c.name << ": " << message;
      EXPECT_NE(message.find(dir.path() + "/tokenizer.json"), std::string::npos) << c.name << ": " << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << c.name << ": " << message;
    }
  }
}

}  // namespace stratum::testing
