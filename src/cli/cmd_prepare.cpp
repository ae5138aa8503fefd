// `stratum prepare`: text, or the documents of a JSON Lines file (Note [documents] in
// data/corpus.h), -> BPE token file (raw uint16 .bin or llm.c shard; a masked shard for prompts
// that are not trained, Note [prompt mask], and for conversations rendered with the model's chat
// template, Note [chat mask] in data/chat_template.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/file_util.h"
#include "core/thread_pool.h"
#include "data/chat_template.h"
#include "data/corpus.h"
#include "data/bpe_tokenizer.h"
#include "data/token_file.h"
#include "stratum/error.h"

namespace stratum {

int cmd_prepare(const std::vector<std::string>& argv) {
  Args args("prepare", argv,
            {{"input", "FILE", "UTF-8 text corpus (required)"},
             {"tokenizer", "DIR", "tokenizer.json (BPE: byte-level, or SentencePiece-style with byte fallback), encoder.json + vocab.bpe, or vocab.json + merges.txt (required)"},
             {"out", "FILE", "token file to write (required)"},
             {"format", "NAME", "raw (nanoGPT uint16 .bin) | llmc (llm.c shard: uint16 ids, or uint32 above "
                                "65535); default raw where every id fits uint16, else llmc"},
             {"jsonl-field", "NAME", "--input is JSON Lines: each line's string field NAME (e.g. text) is one "
                                     "document, written as the tokenizer's BOS (where it adds one), its ids and an "
                                     "end-of-document token"},
             {"jsonl-prompt", "NAME", "with --jsonl-field: each record's string field NAME (e.g. prompt) is "
                                      "its prompt, written before the text and not trained on (the loss is on "
                                      "the text, e.g. the completion, and the end token); writes a masked shard"},
             {"prompt-template", "TEXT", "with --jsonl-field: each record's prompt is TEXT with every {name} "
                                         "replaced by the record's field name (e.g. '### Instruction:\\n{instruction}"
                                         "\\n\\n### Response:\\n'; {{ }} are braces, \\n \\t \\\\ escapes), "
                                         "not trained on, as --jsonl-prompt's"},
             {"jsonl-messages", "NAME", "--input is JSON Lines of conversations: each line's field NAME (e.g. "
                                        "messages) is a list of {\"role\", \"content\"} messages, rendered with the "
                                        "model's chat template (--tokenizer DIR's tokenizer_config.json or "
                                        "chat_template.jinja) and trained on the assistant's answers alone; writes a "
                                        "masked shard"},
             {"chat-answers", "WHICH", "with --jsonl-messages: all (default: every assistant answer trained) | last "
                                       "(each conversation's last answer alone) | each (every answer as its own "
                                       "example: the conversation up to it, that answer trained; for templates that "
                                       "rewrite earlier turns, as Qwen3's)"},
             {"chat-vars", "JSON", "with --jsonl-messages: the template's other variables, a JSON object, e.g. "
                                   "'{\"enable_thinking\": false}' (apply_chat_template's keyword arguments)"},
             {"chat-template", "FILE", "with --jsonl-messages: the Jinja chat template to render with instead of "
                                       "--tokenizer DIR's (e.g. a training template with {% generation %} marks)"},
             {"doc-end", "TOKEN", "with --jsonl-field: the token after each document (default the tokenizer's "
                                  "<|endoftext|>, <|end_of_text|> or </s>)"},
             {"threads", "N", "with --jsonl-field or --jsonl-messages: threads encoding documents (default: all "
                              "CPUs; the same ids for any count)"}});
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum prepare --input corpus.txt --tokenizer DIR --out train.bin").c_str(), stdout);
    return 0;
  }
  const std::string input = args.str("input"), tokenizer_dir = args.str("tokenizer"), out = args.str("out");
  STRATUM_CHECK(!input.empty() && !tokenizer_dir.empty() && !out.empty(),
                "[cli] 'stratum prepare' needs --input FILE --tokenizer DIR --out FILE");
  const std::string given_format = args.str("format", "");
  STRATUM_CHECK(given_format.empty() || given_format == "raw" || given_format == "llmc",
                "[cli] --format must be 'raw' or 'llmc', got '", given_format, "'");
  STRATUM_CHECK(!same_file(input, out), "[prepare] --out '", out, "' is the --input file: it would be overwritten; "
                "choose another --out");
  STRATUM_CHECK(!dir_exists(out), "[prepare] --out '", out, "' is a directory; give the token file's path");
  // A token file (or any binary) is not tokenized again as if it were text. A pipe is read as it comes.
  if (std::filesystem::is_regular_file(input) && std::filesystem::file_size(input) > 0) {
    const DataFileReading reading = data_file_reading(input);
    STRATUM_CHECK(reading.kind != DataFileKind::LlmcShard && reading.kind != DataFileKind::MaskedShard,
                  "[prepare] '", input, "' is ", reading.kind == DataFileKind::LlmcShard ? "an llm.c" : "a masked",
                  " token shard, not text: it goes to train's --data as it is");
    STRATUM_CHECK(reading.kind == DataFileKind::Text, "[prepare] '", input, "' is not read as text (",
                  reading.not_text, "): a token file goes to train's --data as it is",
                  reading.not_text.rfind("byte ", 0) == 0
                      ? "; text in another encoding needs re-encoding first (e.g. iconv -f latin1 -t utf-8)"
                      : "");
  }
  const std::string field = args.str("jsonl-field", "");
  STRATUM_CHECK(!args.has("jsonl-field") || !field.empty(), "[cli] --jsonl-field needs the text's field name, e.g. text");
  STRATUM_CHECK(!args.has("doc-end") || !field.empty(), "[cli] --doc-end is for --jsonl-field NAME (documents)");
  // The prompt (Note [prompt mask]): one field, or a template of several (Note [prompt template]).
  const std::string prompt_field = args.str("jsonl-prompt", "");
  STRATUM_CHECK(!args.has("jsonl-prompt") || !prompt_field.empty(),
                "[cli] --jsonl-prompt needs the prompt's field name, e.g. prompt");
  STRATUM_CHECK(!(args.has("jsonl-prompt") && args.has("prompt-template")),
                "[cli] give the prompt as one field (--jsonl-prompt) or as a template (--prompt-template), not both");
  const PromptTemplate prompt = args.has("prompt-template") ? PromptTemplate::parse(args.str("prompt-template"))
                                : prompt_field.empty()       ? PromptTemplate()
                                                             : PromptTemplate::field(prompt_field);
  STRATUM_CHECK(prompt.empty() || !field.empty(), "[cli] ", prompt.flag, " is for --jsonl-field NAME (documents): "
                "give the field of the text trained on too, e.g. --jsonl-field completion");
  STRATUM_CHECK(prompt_field.empty() || prompt_field != field, "[cli] --jsonl-prompt and --jsonl-field both name \"",
                field, "\"; the prompt and the trained text are two fields");
  STRATUM_CHECK(prompt.empty() || given_format.empty(), "[cli] --format ", given_format,
                " cannot hold the prompt mask of ", prompt.flag, "; leave --format out (a masked shard is written)");
  // Conversations (Note [chat mask] in data/chat_template.h): a field of messages, not of text.
  const std::string messages_field = args.str("jsonl-messages", "");
  STRATUM_CHECK(!args.has("jsonl-messages") || !messages_field.empty(),
                "[cli] --jsonl-messages needs the conversation's field name, e.g. messages");
  STRATUM_CHECK(messages_field.empty() || (field.empty() && prompt.empty() && !args.has("doc-end")),
                "[cli] --jsonl-messages renders each conversation with the chat template, which writes its own turns "
                "and ends: leave out --jsonl-field, --jsonl-prompt, --prompt-template and --doc-end");
  STRATUM_CHECK(messages_field.empty() || given_format.empty(), "[cli] --format ", given_format,
                " cannot hold the answers' loss mask of --jsonl-messages; leave --format out (a masked shard is written)");
  STRATUM_CHECK((!args.has("chat-template") && !args.has("chat-answers") && !args.has("chat-vars")) ||
                    !messages_field.empty(),
                "[cli] --chat-template, --chat-answers and --chat-vars are for --jsonl-messages NAME (conversations)");
  const std::string answers = args.str("chat-answers", "all");
  STRATUM_CHECK(answers == "all" || answers == "last" || answers == "each",
                "[cli] --chat-answers must be all, last or each, got '", answers, "'");
  STRATUM_CHECK(!args.has("threads") || !field.empty() || !messages_field.empty(),
                "[cli] --threads is for --jsonl-field or --jsonl-messages");
  const int threads = static_cast<int>(args.integer("threads", default_thread_count(), 1, 1024));
  const BpeTokenizer tokenizer = BpeTokenizer::load(tokenizer_dir);
  const std::string text = file_read_all(input);
  STRATUM_CHECK(!text.empty(), "[prepare] '", input, "' is empty; nothing to tokenize");
  std::vector<std::int32_t> tokens;
  std::size_t documents = 0;
  const bool masked = !prompt.empty() || !messages_field.empty();
  if (!messages_field.empty()) {  // Note [chat mask]
    ChatTemplate chat = ChatTemplate::load(tokenizer_dir, args.str("chat-template", ""));
    if (args.has("chat-vars")) chat.set_variables(args.str("chat-vars"), "--chat-vars");
    ThreadPool pool(threads);
    documents = chat_jsonl_encode(tokenizer, chat, text, messages_field, "'" + input + "'", pool, tokens,
                                  answers == "all"    ? ChatTemplate::Answers::All
                                  : answers == "last" ? ChatTemplate::Answers::Last
                                                      : ChatTemplate::Answers::Each);
    STRATUM_CHECK(documents > 0, "[prepare] '", input, "' holds no JSON Lines records; nothing to tokenize");
    STRATUM_CHECK(std::any_of(tokens.begin(), tokens.end(), token_is_target), "[prepare] '", input,
                  "' has no assistant message to train on (each conversation's answers are the loss targets)");
  } else if (field.empty()) {
    tokens = tokenizer.encode(text);
  } else {  // Note [documents]
    const std::int32_t end = document_end_id(tokenizer, args.str("doc-end", ""));
    ThreadPool pool(threads);
    documents = jsonl_encode(tokenizer, text, field, prompt, "'" + input + "'", end, pool, tokens);
    STRATUM_CHECK(documents > 0, "[prepare] '", input, "' holds no JSON Lines records; nothing to tokenize");
  }
  std::int32_t max_id = 0;
  for (const std::int32_t t : tokens) max_id = std::max(max_id, token_id(t));  // Note [loss mask]
  // Ids above uint16's (Llama 3's and Qwen2's vocabularies) go to an llm.c shard of uint32 ids.
  const bool wide = max_id > 65535;
  STRATUM_CHECK(!(wide && given_format == "raw"), "[prepare] token ids reach ", max_id,
                ", above the 65535 a raw uint16 file holds (the tokenizer's vocabulary has ", tokenizer.vocab_size(),
                "): use --format llmc (uint32 ids), or leave --format out");
  const std::string format = masked                 ? "masked"
                             : !given_format.empty() ? given_format
                             : wide                  ? "llmc"
                                                     : "raw";
  if (format == "raw") token_file_write_raw_u16(out, tokens);
  else if (format == "llmc") token_file_write_llmc(out, tokens);
  else token_file_write_masked(out, tokens);
  const std::string docs_text =
      documents > 0 ? " in " + std::to_string(documents) + (messages_field.empty() ? " documents" : " conversations") : "";
  const std::string kind = format == "raw" ? ""
                           : format == "masked"
                               ? " (a masked shard: " + std::to_string(token_target_count(tokens.data(), tokens.size())) +
                                     " of the tokens are trained, " +
                                     (messages_field.empty() ? "the prompts' are not)" : "the assistant's answers)")
                           : wide ? " (an llm.c shard of uint32 ids)"
                                  : " (an llm.c shard)";
  std::fprintf(stderr, "[stratum] %s: %zu bytes -> %zu tokens%s (%.2f bytes/token, max id %d) -> %s%s\n",
               input.c_str(), text.size(), tokens.size(), docs_text.c_str(),
               tokens.empty() ? 0.0 : static_cast<double>(text.size()) / tokens.size(), max_id, out.c_str(),
               kind.c_str());
  return 0;
}

}  // namespace stratum
