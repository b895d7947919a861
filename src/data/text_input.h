// Reading a text corpus: whole files checked for UTF-8 (the tokenizer trainer
// and `data prepare` take only valid UTF-8, and say where it is not), and the
// split of a file into documents.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

// Offset of the first byte that is not part of a valid UTF-8 sequence
// (overlongs, surrogates and code points above U+10FFFF are invalid), or npos.
size_t first_invalid_utf8(std::string_view s);

// The file's bytes (decompressed for ".gz" and ".zst": compressed_input.h);
// throws kvs::Error naming the file: unreadable, or "<path>: not UTF-8 text:
// invalid byte 0xff at byte offset 1234" (an offset in the decompressed text).
std::string read_text_file(const std::string& path);

// The paths listed in `list_file`, one per line (blank lines and lines starting
// with '#' skipped), for corpora with more files than a command line holds.
std::vector<std::string> read_input_list(const std::string& list_file);
// One warning line per input file given more than once (the same file under
// any name: a link, "./a" and "a"), whose text would then count twice;
// `command` starts the line. Files that cannot be read are left to the reader.
void warn_repeated_inputs(const std::vector<std::string>& inputs, const std::string& command);

// How a file is cut into documents (docs/DATA.md, "data prepare"):
//   "file"        the whole file is one document;
//   "blank-lines" documents are separated by one or more empty lines;
//   "lines"       every line is a document (one-document-per-line exports).
// A non-empty `delimiter` overrides the mode: documents are separated by lines
// equal to it (e.g. "<|endoftext|>"). Documents are trimmed of the line break
// that ends them; empty (or whitespace-only) documents are dropped.
// With `jsonl_key` set the file is JSON Lines instead (jsonl_documents), and
// neither the mode nor a delimiter applies.
struct DocSplit {
  std::string mode = "file";
  std::string delimiter;
  std::string jsonl_key;  // "": plain text
};
void validate_doc_split(const DocSplit& s);  // throws naming --doc-split
// A file's leading UTF-8 byte-order mark is not text: split_documents and
// tokenizer train drop it (JSON Lines' parser does too).
std::vector<std::string_view> split_documents(std::string_view text, const DocSplit& s);
std::string_view without_byte_order_mark(std::string_view text);
// `delimiter` occurs in `text` but never as a whole line: --doc-delimiter
// then splits nothing (a GPT-2 style dump glues it to the text).
bool delimiter_only_inside_lines(std::string_view text, const std::string& delimiter);

// JSON Lines (as Hugging Face datasets and most pretraining corpora ship):
// every non-blank line is a JSON object whose string field `key` is one
// document, its escapes decoded; empty (or whitespace-only) documents are
// dropped. Throws kvs::Error naming `path` and the line: not JSON, not an
// object, no such field, or not a string.
std::vector<std::string> jsonl_documents(std::string_view text, const std::string& key, const std::string& path);

}  // namespace kvs
