// The machinery behind the config's field tables (config.cpp). One table per
// section lists its keys, each bound to a struct member: the member's type
// says how the key is read (and what a wrong type's message says) and how it
// is written; options add a range rule, `kRequired`, `kOmitIfDefault` or a
// default taken from another key. Parsing (with the unknown-key check and its
// suggestions), to_json, the schema the override walker uses, and the range
// messages of validate() all walk the tables, so a key is added in one line.
//
// Messages (one line, kvs::Error), where <origin> is the file name:
//   "<origin>: unknown key 'train.warmup_step' (did you mean 'train.warmup_steps'?)"
//   "<origin>: train.lr: expected a number, got string \"abc\""
//   "<origin>: missing required key 'model.hidden_size'"
//   "<origin>: model.hidden_size: must be positive, got 0"
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/config_enums.h"

namespace kvs::config {

using nlohmann::json;

std::string join(const std::string& path, std::string_view key);  // "a.b" + "c" = "a.b.c"; "" + "c" = "c"

// Every object of the config file with its keys, in table order (sections
// depth first). The unknown-key check, its suggestions and the override
// walker read it.
struct Schema {
  struct Section {
    std::string path;  // dotted; "" = the top level
    std::vector<std::string> keys;
  };
  std::vector<Section> sections;

  const Section* find(const std::string& path) const;
  // " (did you mean 'x.y'?)" or "": the closest of `known` (the keys of the
  // object at `parent`) when the edit distance is small, else the same key
  // name in another section.
  std::string suggestion(const std::string& key, const std::string& parent,
                         const std::vector<std::string>& known) const;
};

// Where a value sits, for the messages.
struct Where {
  const std::string& origin;  // the file (or whatever the caller named)
  const Schema& schema;       // for "did you mean" suggestions
  std::string path;           // dotted path of this object or key; "" = the top level

  std::string key(std::string_view k) const { return join(path, k); }
  Where at(std::string_view k) const { return {origin, schema, key(k)}; }
};

// "string \"abc\"", "number 3", "array [1,2]": a JSON value in a message.
std::string describe(const json& v);
[[noreturn]] void type_error(const Where& w, const char* expected, const json& got);
void require_object(const json& v, const Where& w);
// Fails on the first key of `j` that is in neither `known` nor `also`.
void check_keys(const json& j, const Where& w, const std::vector<std::string>& known,
                const std::vector<std::string>& also = {});

// JSON value -> member, or a type error naming w.path.
void read_value(const json& v, const Where& w, int& out);       // integral, fits in 32 bits
void read_value(const json& v, const Where& w, uint64_t& out);  // non-negative; as a float only up to 2^53
void read_value(const json& v, const Where& w, double& out);    // finite
void read_value(const json& v, const Where& w, bool& out);
void read_value(const json& v, const Where& w, std::string& out);
void read_value(const json& v, const Where& w, std::vector<std::string>& out);
void read_value(const json& v, const Where& w, std::vector<int>& out);
void read_value(const json& v, const Where& w, std::vector<double>& out);  // finite numbers
template <NamedEnum E>
void read_value(const json& v, const Where& w, E& out) {
  std::string name;
  read_value(v, w, name);
  out = parse_enum<E>(name, w.origin, w.path);
}

// A bound on a number, checked by validate():
// "<origin>: <path>: must be <bound>, got <value>".
struct Rule {
  enum class Kind { Positive, AtLeast, Above, Closed, HalfOpen };
  Kind kind;
  double lo = 0, hi = 0;
  const char* note = nullptr;  // said after the bound, in parentheses

  bool holds(double v) const;  // false for NaN
  std::string bound() const;   // "positive", ">= 1", "> 0", "in [1, 8]", "in [0, 1)"
  template <class T>
  void check(T v, const Where& w) const {
    if (!holds(static_cast<double>(v))) fail("{}: {}: must be {}, got {}", w.origin, w.path, bound(), v);
  }
};
inline Rule positive() { return {Rule::Kind::Positive}; }
inline Rule at_least(double lo, const char* note = nullptr) { return {Rule::Kind::AtLeast, lo, 0, note}; }
inline Rule above(double lo) { return {Rule::Kind::Above, lo}; }
inline Rule closed(double lo, double hi) { return {Rule::Kind::Closed, lo, hi}; }       // [lo, hi]
inline Rule half_open(double lo, double hi) { return {Rule::Kind::HalfOpen, lo, hi}; }  // [lo, hi)

enum class Flag {
  Required,       // a missing key is an error (else the member keeps its default)
  OmitIfDefault,  // to_json leaves the key out while the member (a whole section too) holds its default
};
inline constexpr Flag kRequired = Flag::Required;
inline constexpr Flag kOmitIfDefault = Flag::OmitIfDefault;

// An absent key takes the value of another member of the section (read before it).
template <class S, class T>
struct DefaultFrom {
  T S::*member;
};
template <class S, class T>
DefaultFrom<S, T> default_from(T S::*member) {
  return {member};
}

// The member types a key can have besides a nested section.
template <class T>
concept LeafValue = std::is_same_v<T, int> || std::is_same_v<T, uint64_t> || std::is_same_v<T, double> ||
                    std::is_same_v<T, bool> || std::is_same_v<T, std::string> ||
                    std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<int>> ||
                    std::is_same_v<T, std::vector<double>> || NamedEnum<T>;

template <class S>
struct Field;
template <class S>
using Fields = std::vector<Field<S>>;  // one section's table, in the order of docs/CONFIG.md

template <class S>
void read_section(const Fields<S>& fields, const json& j, const Where& w, S& out,
                  const std::vector<std::string>& also_allowed = {});
template <class S>
json write_section(const Fields<S>& fields, const S& s);
template <class S>
void add_to_schema(const Fields<S>& fields, const std::string& path, Schema& schema);

// One key of section S. Built from {key, &S::member, options...} (a value) or
// {key, &S::member, sub_table, flags...} (a nested object).
template <class S>
struct Field {
  const char* key;
  bool required = false;
  bool omit_if_default = false;
  std::function<void(const json&, const Where&, S&)> read;
  std::function<void(S&)> fill_absent;  // null: an absent key keeps the member's default
  std::function<json(const S&)> write;
  std::function<bool(const S&)> holds_default;
  std::function<void(const S&, const Where&)> check;                // null: only the type is checked
  std::function<void(const std::string&, Schema&)> add_subsection;  // nested objects only

  template <LeafValue T, class... Options>
  Field(const char* k, T S::*member, Options... options) : key(k) {
    read = [member](const json& v, const Where& w, S& s) { read_value(v, w, s.*member); };
    write = [member](const S& s) { return json(s.*member); };
    holds_default = [member](const S& s) { return s.*member == S{}.*member; };
    (set(member, options), ...);
  }

  template <class Sub, class... Flags>
  Field(const char* k, Sub S::*member, const Fields<Sub>& fields, Flags... flags) : key(k) {
    read = [member, &fields](const json& v, const Where& w, S& s) { read_section(fields, v, w, s.*member); };
    write = [member, &fields](const S& s) { return write_section(fields, s.*member); };
    holds_default = [member](const S& s) { return s.*member == Sub{}; };
    add_subsection = [&fields](const std::string& path, Schema& schema) { add_to_schema(fields, path, schema); };
    (set(member, flags), ...);
  }

 private:
  template <class T>
  void set(T S::*, Flag f) {
    (f == Flag::Required ? required : omit_if_default) = true;
  }
  template <class T>
  void set(T S::*member, Rule r) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "a range rule bounds a number");
    check = [member, r](const S& s, const Where& w) { r.check(s.*member, w); };
  }
  template <class T>
  void set(T S::*member, DefaultFrom<S, T> d) {
    fill_absent = [member, d](S& s) { s.*member = s.*d.member; };
  }
};

template <class S>
std::vector<std::string> keys_of(const Fields<S>& fields) {
  std::vector<std::string> keys;
  for (const auto& f : fields) keys.emplace_back(f.key);
  return keys;
}

// JSON object -> struct: checks the object's type and keys (`also_allowed`:
// keys tolerated beside the table's, read by the caller), the required keys,
// then reads every present key in table order; absent keys keep their default.
template <class S>
void read_section(const Fields<S>& fields, const json& j, const Where& w, S& out,
                  const std::vector<std::string>& also_allowed) {
  require_object(j, w);
  check_keys(j, w, keys_of(fields), also_allowed);
  for (const auto& f : fields)
    if (f.required && !j.contains(f.key)) fail("{}: missing required key '{}'", w.origin, w.key(f.key));
  for (const auto& f : fields) {
    const auto it = j.find(f.key);
    if (it != j.end())
      f.read(*it, w.at(f.key), out);
    else if (f.fill_absent)
      f.fill_absent(out);
  }
}

template <class S>
json write_section(const Fields<S>& fields, const S& s) {
  json j = json::object();
  for (const auto& f : fields)
    if (!(f.omit_if_default && f.holds_default(s))) j[f.key] = f.write(s);
  return j;
}

// The range rules of the section's own keys. Nested sections are checked by
// their own call: some apply only in some settings (data.ngram only when
// data.type is "ngram").
template <class S>
void check_section(const Fields<S>& fields, const S& s, const Where& w) {
  for (const auto& f : fields)
    if (f.check) f.check(s, w.at(f.key));
}

template <class S>
void add_to_schema(const Fields<S>& fields, const std::string& path, Schema& schema) {
  schema.sections.push_back({path, keys_of(fields)});
  for (const auto& f : fields)
    if (f.add_subsection) f.add_subsection(join(path, f.key), schema);
}

}  // namespace kvs::config
