// Shard dataset: windows over a token stream, shuffled by a per-epoch affine permutation.
#include "data/shard_dataset.h"

#include <fmt/format.h>
#include <glob.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/sha256.h"
#include "data/shard_manifest_check.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

const uint64_t kShuffleSalt = hash_name("kvshift/data/shards/shuffle");

std::string human_count(uint64_t n) {
  if (n >= 1000000000ull) return fmt::format("{:.1f}B", n / 1e9);
  if (n >= 1000000ull) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1000ull) return fmt::format("{:.1f}K", n / 1e3);
  return std::to_string(n);
}

}  // namespace

std::vector<std::string> expand_shard_paths(const std::vector<std::string>& patterns, const std::string& config_dir,
                                            const std::string& key, bool check_manifests) {
  std::vector<std::string> out;
  std::map<std::string, std::string> seen;  // canonical path -> the pattern that matched it first
  for (const std::string& pat : patterns) {
    KVS_CHECK(!pat.empty(), "{}: empty path", key);
    const std::string full = (pat[0] == '/' || config_dir.empty()) ? pat : config_dir + "/" + pat;
    glob_t g{};
    const int rc = ::glob(full.c_str(), 0, nullptr, &g);
    if (rc == GLOB_NOMATCH) {
      ::globfree(&g);
      fail("{}: no file matches \"{}\"{}", key, pat, full == pat ? "" : fmt::format(" (resolved to \"{}\")", full));
    }
    if (rc != 0) {
      ::globfree(&g);
      fail("{}: cannot expand \"{}\" (glob error {})", key, full, rc);
    }
    std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    ::globfree(&g);
    std::sort(matches.begin(), matches.end());
    for (const std::string& m : matches) {
      std::error_code ec;
      KVS_CHECK(fs::is_regular_file(m, ec), "{}: {} (matched by \"{}\") is not a regular file", key, m, pat);
      const std::string canonical = fs::weakly_canonical(m, ec).string();
      const auto [at, fresh] = seen.emplace(ec ? m : canonical, pat);
      KVS_CHECK(fresh, "{}: {} is matched by \"{}\" and by \"{}\": it would be read twice (to weight a source, "
                "give data.shards.weights)", key, m, at->second, pat);
    }
    if (check_manifests) check_shards_against_manifests(full, matches, key);
    out.insert(out.end(), matches.begin(), matches.end());
  }
  return out;
}

ShardDataset::Stream ShardDataset::open_stream(const std::vector<std::string>& paths) {
  Stream s;
  uint64_t total = 0;
  for (const std::string& p : paths) {
    s.files.push_back(std::make_shared<ShardFile>(p));
    s.offsets.push_back(total);
    total += s.files.back()->size();
  }
  s.offsets.push_back(total);
  s.begin = 0;
  s.end = total;
  return s;
}

ShardDataset::ShardDataset(const ShardDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed,
                           const std::string& config_dir)
    : seq_len_(seq_len), vocab_size_(vocab_size), seed_(seed) {
  KVS_CHECK(!cfg.train.empty(), "data.shards.train: no shard files given");
  open(cfg.train, "data.shards.train", cfg.val, "data.shards.val", cfg.val_fraction, config_dir);
}

ShardDataset::ShardDataset(const ShardDataConfig& cfg, size_t source, int seq_len, int vocab_size, uint64_t seed,
                           const std::string& config_dir)
    : seq_len_(seq_len), vocab_size_(vocab_size), seed_(seed) {
  KVS_CHECK(source < cfg.train.size(), "data.shards.train: no entry {} among {}", source, cfg.train.size());
  const std::string train_key = fmt::format("data.shards.train[{}]", source);
  if (cfg.val.empty()) {
    open({cfg.train[source]}, train_key, {}, "", cfg.val_fraction, config_dir);
  } else {
    KVS_CHECK(cfg.val.size() == cfg.train.size(), "data.shards.val: {} entries for {} sources", cfg.val.size(),
              cfg.train.size());
    open({cfg.train[source]}, train_key, {cfg.val[source]}, fmt::format("data.shards.val[{}]", source),
         cfg.val_fraction, config_dir);
  }
}

void ShardDataset::open(const std::vector<std::string>& train, const std::string& train_key,
                        const std::vector<std::string>& val, const std::string& val_key, double val_fraction,
                        const std::string& config_dir) {
  KVS_CHECK(seq_len_ >= 1, "train.seq_len ({}) must be >= 1", seq_len_);
  const uint64_t window = static_cast<uint64_t>(seq_len_) + 1;

  const std::vector<std::string> train_paths = expand_shard_paths(train, config_dir, train_key);
  train_ = open_stream(train_paths);
  n_files_ = train_paths.size();
  const std::map<std::string, ListedShard> records = manifest_records(train_paths);

  std::vector<std::string> val_paths;
  if (!val.empty()) {
    val_paths = expand_shard_paths(val, config_dir, val_key);
    val_ = open_stream(val_paths);
    n_files_ += val_paths.size();
    KVS_CHECK(val_.size() >= window,
              "{}: {} validation tokens, fewer than one window of train.seq_len + 1 = {} tokens", val_key,
              val_.size(), window);
  } else {
    KVS_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "data.shards.val_fraction ({}) must be in [0, 1)",
              val_fraction);
    val_from_train_ = true;
    const uint64_t total = train_.size();
    const uint64_t n_val = static_cast<uint64_t>(std::floor(static_cast<double>(total) * val_fraction));
    val_ = train_;
    val_.begin = total - n_val;
    train_.end = total - n_val;
    const std::string of = train_key == "data.shards.train" ? "" : " of " + train_key;
    KVS_CHECK(n_val == 0 || n_val >= window,
              "data.shards.val_fraction ({}): the validation split{} has {} of the {} tokens, fewer than one window "
              "of train.seq_len + 1 = {} tokens (give more data, a larger fraction, or data.shards.val files)",
              val_fraction, of, n_val, total, window);
  }
  KVS_CHECK(train_.size() >= window, "{}: {} training tokens{}, fewer than one window of train.seq_len + 1 = {} tokens",
            train_key, train_.size(), val_from_train_ ? " (after the validation split)" : "", window);
  n_train_ = (train_.size() - 1) / static_cast<uint64_t>(seq_len_);
  n_val_ = val_.size() >= window ? (val_.size() - 1) / static_cast<uint64_t>(seq_len_) : 0;

  // Training on validation text (a train glob that also matches the val
  // shards, or the same file in both lists) makes the validation loss
  // measure memorisation: said once, not refused (a deliberate overfit check
  // is a choice).
  std::set<std::string> val_set;
  for (const std::string& p : val_paths) {
    std::error_code ec;
    val_set.insert(fs::weakly_canonical(p, ec).string());
  }
  std::vector<std::string> leaked;
  for (const std::string& p : train_paths) {
    std::error_code ec;
    const auto r = records.find(p);
    if (val_set.count(fs::weakly_canonical(p, ec).string()) || (r != records.end() && r->second.split == "val"))
      leaked.push_back(p);
  }
  if (!leaked.empty() && logs_for_the_world())
    spdlog::warn("{}: {} of its files {} validation data ({}{}): the validation loss measures text the model "
                 "trains on",
                 train_key, leaked.size(), leaked.size() == 1 ? "is" : "are", leaked[0], leaked.size() > 1 ? ", ..." : "");

  // What the splits are made of, for a resume to compare: each file's sha256
  // as its manifest records it (else its name and token count), in order, and
  // the range of the stream the split's windows read (not the stream's end: a
  // val_fraction that moves it without changing a window changes nothing read).
  const uint64_t T = static_cast<uint64_t>(seq_len_);
  auto content_of = [T](const Stream& st, uint64_t windows, const std::vector<std::string>& paths,
                        const std::map<std::string, ListedShard>& recs) {
    Sha256 h;
    for (size_t k = 0; k < paths.size(); ++k) {
      const auto r = recs.find(paths[k]);
      h.update(r != recs.end() && !r->second.sha256.empty()
                   ? "sha256 " + r->second.sha256
                   : fmt::format("file {} {}", fs::path(paths[k]).filename().string(), st.files[k]->size()));
      h.update("\n");
    }
    h.update(fmt::format("range {} {}", st.begin, windows > 0 ? st.begin + windows * T + 1 : st.begin));
    return h.hex();
  };
  train_content_ = content_of(train_, n_train_, train_paths, records);
  val_content_ = val_from_train_ ? content_of(val_, n_val_, train_paths, records)
                                 : content_of(val_, n_val_, val_paths, manifest_records(val_paths));
}

std::string ShardDataset::content_id(Split split) const {
  return split == Split::Train ? train_content_ : val_content_;
}

uint64_t ShardDataset::size(Split split) const { return split == Split::Train ? n_train_ : n_val_; }

uint64_t ShardDataset::tokens(Split split) const { return split == Split::Train ? train_.size() : val_.size(); }

uint64_t ShardDataset::train_window(uint64_t index) const {
  const uint64_t n = n_train_;
  const uint64_t epoch = index / n, j = index % n;
  if (n == 1) return 0;
  const uint64_t es = mix_seed(mix_seed(seed_, kShuffleSalt), epoch);
  uint64_t a = 1 + splitmix64(es) % (n - 1);  // in [1, n)
  while (std::gcd(a, n) != 1) a = a + 1 < n ? a + 1 : 1;
  const uint64_t b = splitmix64(es ^ 0xA5A5A5A5A5A5A5A5ull) % n;
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * j + b) % n);
}

void ShardDataset::read_window(const Stream& s, uint64_t start, int32_t* inputs, int32_t* targets) const {
  const uint64_t len = static_cast<uint64_t>(seq_len_) + 1;
  uint64_t pos = s.begin + start;  // global position in the concatenated files
  // The file holding `pos`: the last k with offsets[k] <= pos.
  size_t k = static_cast<size_t>(std::upper_bound(s.offsets.begin(), s.offsets.end(), pos) - s.offsets.begin()) - 1;
  for (uint64_t t = 0; t < len; ++t, ++pos) {
    while (pos >= s.offsets[k + 1]) ++k;  // skips empty files too
    const ShardFile& f = *s.files[k];
    const uint64_t local = pos - s.offsets[k];
    const uint32_t tok = f.token(local);
    if (tok >= static_cast<uint32_t>(vocab_size_))
      fail("{}: token ID {} at position {} is >= model.vocab_size {}", f.path(), tok, local, vocab_size_);
    if (t < len - 1) inputs[t] = static_cast<int32_t>(tok);
    if (t > 0) targets[t - 1] = static_cast<int32_t>(tok);
  }
}

void ShardDataset::get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const {
  const uint64_t T = static_cast<uint64_t>(seq_len_);
  if (split == Split::Train) {
    read_window(train_, train_window(index) * T, inputs, targets);
  } else {
    KVS_CHECK(n_val_ > 0, "shards: no validation data (data.shards.val is empty and data.shards.val_fraction is 0)");
    read_window(val_, (index % n_val_) * T, inputs, targets);
  }
  std::fill(mask, mask + seq_len_, 1.0f);
}

std::string ShardDataset::describe() const {
  return fmt::format("shards: {} file{}, {} train tokens ({} windows), {} val tokens ({} windows{})", n_files_,
                     n_files_ == 1 ? "" : "s", human_count(train_.size()), n_train_, human_count(val_.size()), n_val_,
                     val_from_train_ ? ", split from train" : "");
}

}  // namespace kvs
