// corpus_load_tokens; see corpus.h.
#include "data/corpus.h"

#include "core/file_util.h"
#include "data/bpe_tokenizer.h"
#include "data/token_file.h"
#include "stratum/error.h"

namespace stratum {

std::string corpus_find_tokenizer(const std::string& explicit_dir, const std::string& model_dir) {
  if (!explicit_dir.empty()) return explicit_dir;
  if (model_dir.empty()) return "";
  return BpeTokenizer::files_in(model_dir).empty() ? "" : model_dir;
}

std::vector<std::int32_t> corpus_load_tokens(const std::string& path, const std::string& tokenizer_dir,
                                             int vocab_size, std::string* note) {
  const std::string problem = file_read_problem(path);
  STRATUM_CHECK(problem.empty(), "[data] data file '", path, "' ", problem, "; give a text file or a token file");
  const DataFileReading reading = data_file_reading(path);  // Note [data by content]
  if (note != nullptr) *note = reading.note;
  std::vector<std::int32_t> tokens;
  if (reading.kind != DataFileKind::Text) {
    tokens = token_file_read(path).tokens;
  } else {
    STRATUM_CHECK(!tokenizer_dir.empty(), "[data] '", path,
                  "' is text: give --tokenizer DIR (encoder.json + vocab.bpe), or tokenize it first with "
                  "'stratum prepare'");
    const std::string text = file_read_all(path);
    STRATUM_CHECK(!text.empty(), "[data] corpus '", path, "' is empty; give a file with some text");
    tokens = BpeTokenizer::load(tokenizer_dir).encode(text);
  }
  STRATUM_CHECK(tokens.size() >= 2, "[data] '", path, "' holds ", tokens.size(),
                " token(s); training needs at least 2");
  if (vocab_size > 0) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      STRATUM_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, "[data] '", path, "': token id ", tokens[i],
                    " at position ", i, " is outside the model's vocabulary [0, ", vocab_size,
                    "); the data was tokenized for a different model");
  }
  return tokens;
}

}  // namespace stratum
