// Compressed corpus files (src/data/compressed_input.h): gzip (one member or
// several) and zstd decompress to the plain file's bytes, corrupt and cut
// files are errors naming the file, and `data prepare` and `tokenizer train`
// give from them what they give from the plain files.
#include <gtest/gtest.h>

#ifdef KVS_HAVE_ZLIB
#include <zlib.h>
#endif
#ifdef KVS_HAVE_ZSTD
#include <zstd.h>
#endif

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "data/compressed_input.h"
#include "data/prepare.h"
#include "test_util.h"
#include "text_corpus_util.h"
#include "tokenizer/train.h"

namespace kvs {
namespace {

using testing_util::corpus_text;
using testing_util::shared_tokenizer_dir;
using testing_util::slurp;
using testing_util::spit;
using testing_util::TmpDir;

#ifdef KVS_HAVE_ZLIB
std::string gzip(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);  // 16: a gzip header
  std::string out(deflateBound(&z, in.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}
#endif

#ifdef KVS_HAVE_ZSTD
std::string zstd(const std::string& in) {
  std::string out(ZSTD_compressBound(in.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}
#endif

TEST(CompressedInput, DecompressesToThePlainBytes) {
  TmpDir tmp;
  const std::string text = corpus_text(300, 7) + "café ✓\n";
  spit(tmp / "plain.txt", text);
  EXPECT_EQ(read_input_bytes(tmp / "plain.txt"), text);
  int checked = 0;
#ifdef KVS_HAVE_ZLIB
  spit(tmp / "a.txt.gz", gzip(text));
  EXPECT_EQ(read_input_bytes(tmp / "a.txt.gz"), text);
  // Two members back to back (`cat a.gz b.gz`): both.
  spit(tmp / "two.txt.gz", gzip(text.substr(0, 1000)) + gzip(text.substr(1000)));
  EXPECT_EQ(read_input_bytes(tmp / "two.txt.gz"), text);
  spit(tmp / "empty.gz", gzip(""));
  EXPECT_EQ(read_input_bytes(tmp / "empty.gz"), "");
  const std::string gz = gzip(text);
  spit(tmp / "cut.gz", gz.substr(0, gz.size() / 2));
  EXPECT_KVS_ERROR(read_input_bytes(tmp / "cut.gz"), tmp / "cut.gz", "truncated gzip data");
  spit(tmp / "bad.gz", "this is not gzip at all");
  EXPECT_KVS_ERROR(read_input_bytes(tmp / "bad.gz"), tmp / "bad.gz", "not valid gzip data");
  // Garbage after a whole member: the offset is the file's, not the second member's (about 2 bytes in).
  const std::string member = gzip(text.substr(0, 1000));
  spit(tmp / "tail.gz", member + "garbage");
  EXPECT_KVS_ERROR(read_input_bytes(tmp / "tail.gz"), tmp / "tail.gz", "not valid gzip data",
                   "at compressed byte " + std::to_string(member.size() + 2));
  ++checked;
#endif
#ifdef KVS_HAVE_ZSTD
  spit(tmp / "a.txt.zst", zstd(text));
  EXPECT_EQ(read_input_bytes(tmp / "a.txt.zst"), text);
  spit(tmp / "two.txt.zst", zstd(text.substr(0, 1000)) + zstd(text.substr(1000)));  // two frames
  EXPECT_EQ(read_input_bytes(tmp / "two.txt.zst"), text);
  const std::string zs = zstd(text);
  spit(tmp / "cut.zst", zs.substr(0, zs.size() / 2));
  EXPECT_KVS_ERROR(read_input_bytes(tmp / "cut.zst"), tmp / "cut.zst", "truncated zstd data");
  spit(tmp / "bad.zst", "this is not zstd at all");
  EXPECT_KVS_ERROR(read_input_bytes(tmp / "bad.zst"), tmp / "bad.zst", "not valid zstd data");
  ++checked;
#endif
  // The build says what it reads; scripts/setup.sh installs both libraries, so CI reads both.
  EXPECT_EQ(input_compressions(), checked == 2 ? "gzip, zstd" : checked == 0 ? "none" : input_compressions());
  if (checked < 2) GTEST_SKIP() << "built without zlib or libzstd: " << input_compressions();
}

TEST(CompressedInput, PrepareAndTokenizerGiveWhatThePlainFilesGive) {
#if !defined(KVS_HAVE_ZLIB) || !defined(KVS_HAVE_ZSTD)
  GTEST_SKIP() << "built without zlib or libzstd";
#else
  TmpDir tmp;
  const std::string a = corpus_text(200, 3), b = corpus_text(150, 11);
  std::string jsonl;
  for (size_t at = 0, nl; at < a.size(); at = nl + 1) {  // a document per line of `a`
    nl = a.find('\n', at);
    if (nl == std::string::npos) nl = a.size();
    jsonl += nlohmann::json({{"text", a.substr(at, nl - at)}}).dump() + "\n";
  }
  spit(tmp / "a.jsonl", jsonl);
  spit(tmp / "a.jsonl.zst", zstd(jsonl));
  spit(tmp / "b.txt", b);
  spit(tmp / "b.txt.gz", gzip(b));
  auto prepare = [&](const std::string& a_file, const std::string& b_file, const std::string& out) {
    PrepareOptions o;
    o.tokenizer = shared_tokenizer_dir();
    o.out = tmp / out;
    o.progress = false;
    o.val_fraction = 0.3;
    o.split.jsonl_key = "text";
    o.inputs = {a_file};
    prepare_data(o);  // the JSON Lines
    o.split.jsonl_key.clear();
    o.split.mode = "lines";
    o.inputs = {b_file};
    o.out = tmp / (out + "_text");
    prepare_data(o);
  };
  prepare(tmp / "a.jsonl", tmp / "b.txt", "plain");
  prepare(tmp / "a.jsonl.zst", tmp / "b.txt.gz", "packed");
  for (const char* dir : {"", "_text"})
    for (const char* shard : {"train_000000.bin", "val_000000.bin"}) {
      EXPECT_GT(slurp(tmp / ("plain" + std::string(dir) + "/" + shard)).size(), 100u) << dir << " " << shard;
      EXPECT_EQ(slurp(tmp / ("packed" + std::string(dir) + "/" + shard)),
                slurp(tmp / ("plain" + std::string(dir) + "/" + shard)))
          << dir << " " << shard;
    }

  // The summary counts both the file as stored and its text.
  PrepareOptions o;
  o.tokenizer = shared_tokenizer_dir();
  o.out = tmp / "summary";
  o.progress = false;
  o.inputs = {tmp / "b.txt.gz"};
  const PrepareResult r = prepare_data(o);
  EXPECT_EQ(r.bytes, static_cast<int64_t>(std::filesystem::file_size(tmp / "b.txt.gz")));
  EXPECT_EQ(r.text_bytes, static_cast<int64_t>(b.size()));
  EXPECT_LT(r.bytes, r.text_bytes);

  TokenizerTrainOptions plain, packed;
  plain.inputs = {tmp / "b.txt"};
  packed.inputs = {tmp / "b.txt.gz"};
  plain.vocab_size = packed.vocab_size = 400;
  plain.out = tmp / "tok_plain";
  packed.out = tmp / "tok_packed";
  EXPECT_EQ(train_tokenizer(packed).sha256, train_tokenizer(plain).sha256);
#endif
}

}  // namespace
}  // namespace kvs
