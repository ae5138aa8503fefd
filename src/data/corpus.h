// Turns a --data argument into tokens: a token file is read as is, UTF-8 text is encoded with the
// BPE tokenizer (which one is decided by content). Checks every id against the vocabulary.
// Also the documents of a JSON Lines file as training tokens (Note [documents]).
// Does not batch (see data_loader.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace stratum {

class BpeTokenizer;
class ThreadPool;

// tokenizer_dir may be empty when path is a token file. vocab_size > 0 enables the id check.
// A masked shard's tokens come as held (Note [loss mask] in token_file.h), at least one a target.
// Text or tokens is decided by content (data_file_reading); `note`, when given, receives its note
// (which reading was chosen when the content overrode the file's name; else empty).
std::vector<std::int32_t> corpus_load_tokens(const std::string& path, const std::string& tokenizer_dir,
                                             int vocab_size, std::string* note = nullptr);

// The tokenizer directory to use: `explicit_dir` if set, else `model_dir` when it holds a
// tokenizer file set (BpeTokenizer::files_in), else empty.
std::string corpus_find_tokenizer(const std::string& explicit_dir, const std::string& model_dir);

// Note [documents]: a fine-tuning corpus is often JSON Lines, one record per line, its text in a
// string field ("text"). `stratum prepare --jsonl-field text` reads each record's field as one
// document and writes what Hugging Face's tokenizer gives a document and training frameworks
// (nanoGPT, llm.c, run_clm with an EOS) put between documents: the tokenizer's BOS first where
// its post_processor adds one (Llama 2's <s>, Llama 3's <|begin_of_text|>; GPT-2 and Qwen add
// none), the document's ids, then an end-of-document token, so no sequence runs from one
// document into the next unmarked. Blank lines are skipped; an empty field is a document of no
// text (its BOS and end only).
// Note [prompt mask]: instruction data pairs a prompt with its answer (TRL's prompt-completion
// records: {"prompt": ..., "completion": ...}), and fine-tuning on it trains the answer only.
// `prepare --jsonl-prompt prompt --jsonl-field completion` writes each record as its BOS, the
// prompt's ids, the completion's ids and the end token, the BOS and the prompt's ids marked as
// no loss targets (Note [loss mask] in token_file.h), in a masked shard. The prompt and the
// completion are encoded each alone (as encode() gives each) and joined, so every token is wholly
// one or the other; whatever separates them (a newline, a space) is written in the data, at the
// end of the prompt or the start of the completion.
// Note [prompt template]: instruction datasets in Alpaca's and Dolly's layout keep the prompt in
// several fields ("instruction", "input"; "context") that a fixed text joins. `prepare
// --prompt-template TEXT` writes each record's prompt as TEXT with every {name} replaced by the
// record's string field `name`; {{ and }} are literal braces and \n, \t, \\ the newline, tab and
// backslash (a shell passes them as typed). --jsonl-prompt NAME is the template "{NAME}".
class PromptTemplate {
 public:
  struct Piece {
    bool field = false;  // a record's field (text: its name), else literal text
    std::string text;
  };
  PromptTemplate() = default;  // no prompt: the records are documents alone
  // Throws Error "[prepare] --prompt-template ...: ..." for an empty text, an unmatched brace, an
  // empty {} or an unknown escape.
  static PromptTemplate parse(std::string_view text);
  static PromptTemplate field(const std::string& name);  // "{name}"
  bool empty() const { return pieces_.empty(); }
  const std::vector<Piece>& pieces() const { return pieces_; }
  std::string flag;  // the option that gave it, for messages ("--jsonl-prompt", "--prompt-template")

 private:
  std::vector<Piece> pieces_;
};

// Calls each(line, record) for every non-blank line of the JSON Lines `text`, in order (line counts
// from 1), each a JSON object (Json: nlohmann::json, or nlohmann::ordered_json where the record's
// key order matters). A line that is not valid JSON, or not an object, throws Error "[prepare]
// <where> line N: ..."; `expected` ends the latter ("an object with a string field \"text\"").
template <class Json>
void jsonl_objects(std::string_view text, const std::string& where, const std::string& expected,
                   const std::function<void(std::size_t line, Json& record)>& each);

// Calls each(line, prompt, document) for the string `field` (and the prompt `prompt` makes of the
// record, when it is not empty; else prompt is empty) of every non-blank line of the JSON Lines
// `text`, in order (line counts from 1). A line that is not a JSON object whose fields are strings
// throws Error "[prepare] <where> line N: ...", naming the line's fields when it lacks one.
void jsonl_documents(std::string_view text, const std::string& field, const PromptTemplate& prompt,
                     const std::string& where,
                     const std::function<void(std::size_t line, const std::string& prompt,
                                              const std::string& document)>& each);

// The end-of-document id: the token whose text is `given` when set (an added token such as
// "<|im_end|>"), else the first of "<|endoftext|>" (GPT-2, Qwen), "<|end_of_text|>" (Llama 3) and
// "</s>" (Llama 2, Mistral) the tokenizer has. Throws Error naming --doc-end when there is none.
std::int32_t document_end_id(const BpeTokenizer& tokenizer, const std::string& given);

// Appends one document's training ids to `out` (Note [documents]): BOS where the tokenizer adds
// one, the text's ids, `end`. With a prompt, the prompt's ids after the BOS, both no loss targets
// (Note [prompt mask]).
void document_encode(const BpeTokenizer& tokenizer, const std::string& document, std::int32_t end,
                     std::vector<std::int32_t>& out, const std::string* prompt = nullptr);

// Every document of the JSON Lines `text` (jsonl_documents; with a `prompt`, a prompt each)
// encoded with document_encode and appended to `out` in file order; returns how many. The records
// are read in order on the caller
// and encoded in batches (up to kJsonlBatchBytes of text or kJsonlBatchDocuments records), each
// batch's documents split over `pool`: documents are independent, so the ids are the same for
// any thread count.
inline constexpr std::size_t kJsonlBatchBytes = 8u << 20;
inline constexpr std::size_t kJsonlBatchDocuments = 8192;
std::size_t jsonl_encode(const BpeTokenizer& tokenizer, std::string_view text, const std::string& field,
                         const PromptTemplate& prompt, const std::string& where, std::int32_t end, ThreadPool& pool,
                         std::vector<std::int32_t>& out);

}  // namespace stratum
