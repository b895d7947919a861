// The checkpoint manifests' checksums (core/checksum.cpp): a file is read in 4 MiB chunks, and
// every chunk must reach the digest. Checkpoint tests use files of a few kB, one chunk each.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/checksum.h"
#include "test_util.h"

using namespace kvs::testing_util;

// Known answers (the Python xxhash package's xxh3_64_hexdigest).
TEST(Checksum, Xxh3KnownAnswers) {
  EXPECT_EQ(kvs::xxh3_hex("", 0), "2d06800538d394c2");
  EXPECT_EQ(kvs::xxh3_hex("kvshift", 7), "8038359ed1c30ef1");
}

// 9 MiB + 3 bytes: two whole chunks and a partial one. A byte flipped in each of them changes
// the digest, and the file's digest is the buffer's.
TEST(Checksum, AFileOfSeveralChunksIsHashedWhole) {
  TmpDir tmp;
  const std::string path = tmp / "big.bin";
  std::string data((size_t{9} << 20) + 3, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  spit(path, data);
  const kvs::FileDigest whole = kvs::digest_file(path);
  EXPECT_EQ(whole.bytes, data.size());
  EXPECT_EQ(whole.xxh3, kvs::xxh3_hex(data.data(), data.size()));
  for (size_t at : {size_t{10}, size_t{5} << 20, data.size() - 1}) {
    std::string changed = data;
    changed[at] ^= 0x01;
    spit(path, changed);
    EXPECT_NE(kvs::digest_file(path).xxh3, whole.xxh3) << "a byte flipped at " << at;
  }
}

TEST(Checksum, AMissingFileIsAnErrorNamingIt) {
  EXPECT_KVS_ERROR(kvs::digest_file("/nonexistent/kvs_checksum"), "/nonexistent/kvs_checksum: cannot read: ");
}
