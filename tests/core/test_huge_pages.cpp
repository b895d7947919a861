// core/huge_pages.h: large host buffers 2 MiB-aligned and advised for
// transparent huge pages, small ones ordinary; the CPU engine's big buffers use it.
#include "core/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/cpu_engine.h"

namespace kvs {
namespace {

// The system's THP mode from /sys/kernel/mm/transparent_hugepage/enabled:
// "always", "madvise", "never", or "" where the file is absent.
std::string transparent_huge_page_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return {};
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return {};
  return line.substr(open + 1, close - open - 1);
}

bool huge_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kHugePageBytes == 0; }

// AnonHugePages (kB) of the mapping in /proc/self/smaps that holds p, -1 if none does.
long anon_huge_kb(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) return std::stol(line.substr(14));
  }
  return -1;
}

TEST(HugePages, LargeBuffersAreHugePageAlignedSmallOnesAreOrdinary) {
  HostVector<float> big(kHugePageBytes / sizeof(float) + 1, 1.5f), small(1000, 2.5f);
  EXPECT_TRUE(huge_aligned(big.data()));
  EXPECT_EQ(big.back(), 1.5f);
  EXPECT_EQ(small.back(), 2.5f);
  // A buffer that grows past the threshold moves onto aligned memory, its contents kept.
  HostVector<float> grows(16, 3.0f);
  grows.resize(kHugePageBytes / sizeof(float) * 3, 4.0f);
  EXPECT_TRUE(huge_aligned(grows.data()));
  EXPECT_EQ(grows[15], 3.0f);
  EXPECT_EQ(grows[16], 4.0f);
  grows.swap(small);
  EXPECT_EQ(small[15], 3.0f);
  EXPECT_EQ(grows.size(), 1000u);
}

TEST(HugePages, TheKernelBacksALargeBufferWithHugePagesWhereTHPIsOn) {
  const std::string mode = transparent_huge_page_mode();
  if (mode != "always" && mode != "madvise") GTEST_SKIP() << "transparent huge pages are '" << mode << "' here";
  HostVector<float> buf(4 * kHugePageBytes / sizeof(float));
  std::memset(buf.data(), 1, buf.size() * sizeof(float));  // first touch: the faults that get huge pages
  EXPECT_GT(anon_huge_kb(buf.data()), 0) << "THP mode " << mode << ", but no huge page backs the advised buffer";
}

// In a process whose heap has held large blocks, as a long-running one's
// has: glibc raises its mmap threshold when a mapped block is freed and then
// serves large blocks from the heap, whose pages are already touched (and
// so not backed anew). The buffer must still get huge pages.
TEST(HugePages, ALargeBufferGetsHugePagesAfterTheHeapHeldLargeBlocks) {
  const std::string mode = transparent_huge_page_mode();
  if (mode != "always" && mode != "madvise") GTEST_SKIP() << "transparent huge pages are '" << mode << "' here";
  for (size_t mb : {32, 16, 12}) {  // mapped, freed (threshold up), then heap blocks, touched and freed
    std::vector<char> block(mb << 20);
    std::memset(block.data(), 1, block.size());
  }
  HostVector<float> buf(4 * kHugePageBytes / sizeof(float));
  std::memset(buf.data(), 1, buf.size() * sizeof(float));
  EXPECT_GT(anon_huge_kb(buf.data()), 0) << "THP mode " << mode << ", but no huge page backs the advised buffer";
}

TEST(HugePages, TheCpuEnginesParametersAndGradientsAreOnHugePageAlignedMemory) {
  ModelConfig m;  // about 1.6 M parameters (6 MB): above the threshold
  m.hidden_size = 256;
  m.intermediate_size = 688;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.vocab_size = 256;
  m.max_position_embeddings = 64;
  CpuEngine e(m, 2, 64);
  EXPECT_TRUE(huge_aligned(e.host_params()));
  EXPECT_TRUE(huge_aligned(e.host_grads()));
}

// ZeroedHostBuffer: zeros whatever its size, on huge-page-aligned memory when
// large, and a moved-from buffer gives its memory up once.
TEST(HugePages, ZeroedHostBuffersAreZerosOfEverySizeAndMove) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, kHugePageBytes / sizeof(float) + 3}) {
    ZeroedHostBuffer<float> b(n);
    ASSERT_EQ(b.size(), n);
    EXPECT_EQ(b.empty(), n == 0);
    for (float x : b) ASSERT_EQ(x, 0.0f) << n;
    if (n * sizeof(float) >= kHugePageBytes) {
      EXPECT_TRUE(huge_aligned(b.data()));
    }
    if (n) {
      b.data()[n - 1] = 7.0f;
    }
    ZeroedHostBuffer<float> moved(std::move(b));
    EXPECT_EQ(moved.size(), n);
    EXPECT_TRUE(b.empty());
    if (n) {
      EXPECT_EQ(moved.data()[n - 1], 7.0f);
    }
    b = std::move(moved);
    EXPECT_EQ(b.size(), n);
  }
}

}  // namespace
}  // namespace kvs
