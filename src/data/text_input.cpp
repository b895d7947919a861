#include "data/text_input.h"

#include <sys/stat.h>

#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "data/compressed_input.h"

namespace kvs {

size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;  // no surrogates
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;  // <= U+10FFFF
    else return i;
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string read_text_file(const std::string& path) {
  std::string s = read_input_bytes(path);
  const size_t bad = first_invalid_utf8(s);
  if (bad != std::string_view::npos)
    fail("{}: not UTF-8 text: invalid byte 0x{:02x} at byte offset {}", path, static_cast<unsigned char>(s[bad]), bad);
  return s;
}

void warn_repeated_inputs(const std::vector<std::string>& inputs, const std::string& command) {
  std::map<std::pair<dev_t, ino_t>, size_t> first;  // file -> its first position in `inputs`
  std::map<size_t, size_t> times;                   // first position -> how often given
  for (size_t i = 0; i < inputs.size(); ++i) {
    struct stat st {};
    if (::stat(inputs[i].c_str(), &st) != 0) continue;
    const auto [at, fresh] = first.emplace(std::make_pair(st.st_dev, st.st_ino), i);
    ++times[at->second];
  }
  for (const auto& [i, n] : times)
    if (n > 1)
      spdlog::warn("{}: {} is given {} times: its text counts {} times", command, inputs[i], n, n);
}

std::vector<std::string> read_input_list(const std::string& list_file) {
  const std::string text = read_file(list_file);
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Blank lines (whitespace only) and comments are skipped; a path keeps its spaces.
    const bool blank = line.find_first_not_of(" \t") == std::string::npos;
    if (!blank && line[0] != '#') out.push_back(line);
    pos = nl + 1;
  }
  KVS_CHECK(!out.empty(), "{}: the input list names no files", list_file);
  return out;
}

void validate_doc_split(const DocSplit& s) {
  if (!s.jsonl_key.empty()) {
    KVS_CHECK(s.mode == "file" && s.delimiter.empty(),
              "--jsonl: every line of a JSON Lines file is one document; --doc-split and --doc-delimiter do not "
              "apply");
    return;
  }
  KVS_CHECK(s.mode == "file" || s.mode == "blank-lines" || s.mode == "lines",
            "--doc-split must be file, blank-lines or lines (got \"{}\")", s.mode);
  KVS_CHECK(s.delimiter.find('\n') == std::string::npos, "--doc-delimiter must be a single line");
}

namespace {

bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos; }

// A line without its '\n' (and a '\r' before it, for delimiter comparison only).
std::string_view strip_cr(std::string_view line) {
  return !line.empty() && line.back() == '\r' ? line.substr(0, line.size() - 1) : line;
}

}  // namespace

std::vector<std::string> jsonl_documents(std::string_view text, const std::string& key, const std::string& path) {
  std::vector<std::string> docs;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (blank(line)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not JSON ({}); --jsonl reads one JSON object per line", path, line_no, e.what());
    }
    KVS_CHECK(j.is_object(), "{}:{}: a JSON {}, not an object; --jsonl reads one JSON object per line", path, line_no,
              j.type_name());
    const auto it = j.find(key);
    KVS_CHECK(it != j.end(), "{}:{}: no field \"{}\" (--text-key names the field that holds the text)", path,
              line_no, key);
    KVS_CHECK(it->is_string(), "{}:{}: field \"{}\" is a JSON {}, not a string", path, line_no, key,
              it->type_name());
    std::string d = it->get<std::string>();
    if (!blank(d)) docs.push_back(std::move(d));
  }
  return docs;
}

std::string_view without_byte_order_mark(std::string_view text) {
  return text.substr(0, 3) == "\xEF\xBB\xBF" ? text.substr(3) : text;
}

bool delimiter_only_inside_lines(std::string_view text, const std::string& delimiter) {
  if (delimiter.empty() || text.find(delimiter) == std::string_view::npos) return false;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    if (strip_cr(text.substr(pos, nl - pos)) == delimiter) return false;
    pos = nl + 1;
  }
  return true;
}

std::vector<std::string_view> split_documents(std::string_view text, const DocSplit& s) {
  text = without_byte_order_mark(text);
  std::vector<std::string_view> docs;
  auto emit = [&](size_t begin, size_t end) {
    std::string_view d = text.substr(begin, end - begin);
    if (!d.empty() && d.back() == '\n') d.remove_suffix(1);  // the break that ends it separates, not content
    if (!blank(d)) docs.push_back(d);
  };
  if (s.delimiter.empty() && s.mode == "file") {
    emit(0, text.size());
    return docs;
  }
  size_t doc_begin = 0, pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    const size_t line_end = nl == std::string_view::npos ? text.size() : nl + 1;
    const std::string_view line = strip_cr(text.substr(pos, (nl == std::string_view::npos ? text.size() : nl) - pos));
    if (!s.delimiter.empty()) {
      if (line == s.delimiter) {
        emit(doc_begin, pos);
        doc_begin = line_end;
      }
    } else if (s.mode == "lines") {
      emit(pos, line_end);
      doc_begin = line_end;
    } else if (blank(line)) {  // blank-lines
      emit(doc_begin, pos);
      doc_begin = line_end;
    }
    pos = line_end;
  }
  emit(doc_begin, text.size());
  return docs;
}

}  // namespace kvs
