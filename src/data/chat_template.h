// A model's chat template (Note [chat template]) and conversations rendered with it: as training
// documents whose assistant turns alone are trained (Note [chat mask]), and as generation prompts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/jinja.h"

namespace stratum {

class BpeTokenizer;
class ThreadPool;

// Note [chat template]: an instruction-tuned model ships the Jinja template that turns a
// conversation (a list of {"role", "content"} messages) into its text: chat_template.jinja in the
// model directory (transformers >= 4.50 writes it) or tokenizer_config.json's "chat_template" (a
// string, or a list of {"name", "template"}, of which "default" is used). transformers'
// apply_chat_template renders it (formats/jinja.h, Note [jinja subset]) with the variables
// messages, add_generation_prompt, tools and documents (none unless given), and the tokenizer's
// special tokens (bos_token, eos_token, unk_token, pad_token, ... from tokenizer_config.json,
// strings or {"content": ...} objects), then tokenizes the text without adding a BOS (the
// template writes the one it wants); Stratum does the same.
class ChatTemplate {
 public:
  // The template of model (or tokenizer) directory `dir`, or the Jinja file `file` when given
  // (its special tokens still from dir's tokenizer_config.json). Throws Error naming --chat-template
  // when dir has none, and "[template] ..." for a template this engine cannot parse.
  static ChatTemplate load(const std::string& dir, const std::string& file = "");
  // Note [chat variables]: apply_chat_template passes its extra keyword arguments to the template
  // (Qwen3's enable_thinking=False writes an empty reasoning block after the generation prompt);
  // --chat-vars '{"enable_thinking": false}' gives them here, `json` a JSON object whose values
  // every render sees. Throws Error naming `flag` for text that is not a JSON object or a name the
  // renderer sets itself (messages, add_generation_prompt, tools, documents).
  void set_variables(const std::string& json, const std::string& flag);
  // Whether `dir` has a template for load(dir) to find (it may still fail to parse or load).
  static bool exists(const std::string& dir);

  // The text of `messages` (a JSON array of message objects); `tools`, when not null, is passed
  // as the template's tools. Throws Error "[template] ..." when the template raises or fails.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools = nullptr) const;

  // Note [chat mask]: training on a conversation trains the assistant's turns alone, as TRL's
  // assistant_only_loss does. A template with {% generation %} blocks marks them itself
  // (transformers' return_assistant_tokens_mask): the text rendered inside them is trained. Any
  // other template: the conversation's text R is rendered once; for each assistant message i the
  // prompt P = render(messages[:i], add_generation_prompt) must be a prefix of R (the text a model
  // sees before answering is what it is trained on), and the answer is R from there up to where
  // B = render(messages[:i+1]) stops agreeing with R: its content and whatever closes the turn
  // (<|im_end|>, <|eot_id|>, </s>), which the model must learn to write. Where B's ending and R's
  // next turn begin alike ("</s>" and "<|user|>" share "<"), that end is moved back to the start
  // of the `special` token (the tokenizer's added tokens) it would split, so no special token is
  // cut in two. A template that renders a turn differently once later turns follow (Qwen3's drops
  // earlier turns' reasoning; Mistral's moves the system prompt to the last user turn) gives no
  // such answer: refused with the turn named; TRL's answer is the same (a training template with
  // {% generation %} marks, given here with --chat-template FILE). Each segment is tokenized
  // alone (as the prompt of Note [prompt mask]), so every token is wholly answer or context.
  // Note [chat answers]: which answers a conversation trains (prepare --chat-answers). All: every
  // assistant message (the default). Last: the last one alone, the earlier ones context; it needs
  // only the prompt before it to be a prefix of the conversation, so templates that rewrite
  // earlier turns work. Each: every assistant message i as its own example, messages[:i+1] with
  // its last answer trained: what a model with such a template sees when it writes answer i
  // (Qwen3's earlier answers without their reasoning), at the cost of each earlier turn's tokens
  // again per later answer.
  enum class Answers { All, Last, Each };
  struct Segment {
    std::string text;
    bool target = false;  // an assistant's answer: trained; else context only
  };
  // The conversation's text in order, split into answers and context; with Each, the examples
  // one after another.
  std::vector<Segment> segments(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                const std::string& where, const std::vector<std::string>& special = {},
                                Answers answers = Answers::All) const;

  const std::string& source() const { return source_; }  // where the template came from, for messages

 private:
  JinjaTemplate::Rendered rendered(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                   const nlohmann::ordered_json& tools) const;
  std::vector<Segment> segments_of(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                   const std::string& where, const std::vector<std::string>& special,
                                   Answers answers) const;
  JinjaTemplate template_;
  nlohmann::ordered_json specials_ = nlohmann::ordered_json::object();
  std::string source_;
};

// The conversations of JSON Lines `text` (each record's field `field`: a list of messages with
// string roles; the record's "tools", when present, passed as the template's tools), rendered
// and encoded each into `out` as ChatTemplate::segments gives them: the answers' ids trained,
// the rest no loss targets (Note [loss mask] in token_file.h); nothing added between
// conversations (the template writes each one's BOS and turn ends). Records are read on the
// caller and rendered and encoded in batches of 4096 over `pool` (the same ids for any thread count).
// `answers` says which answers are trained (Note [chat answers]; Each writes one example per
// answer). Returns the number of conversations.
std::size_t chat_jsonl_encode(const BpeTokenizer& tokenizer, const ChatTemplate& chat, std::string_view text,
                              const std::string& field, const std::string& where, ThreadPool& pool,
                              std::vector<std::int32_t>& out, ChatTemplate::Answers answers = ChatTemplate::Answers::All);

}  // namespace stratum
