// One function per subcommand: each adds its CLI11 subcommand with every flag
// documented, and runs it when selected.
#pragma once
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

namespace kvs::cli {

// A flag's check: digits only ("-1" into an unsigned option would wrap
// around) and at most 2^64 - 1 (a larger value would saturate to it; an int
// option's own conversion refuses what does not fit an int).
inline const CLI::Validator kNonNegativeInteger(
    [](std::string& v) {
      uint64_t x = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
        return "must be a non-negative integer, got '" + v + "'";
      return ec == std::errc() && end == v.data() + v.size()
                 ? std::string()
                 : "must be at most 18446744073709551615, got '" + v + "'";
    },
    "", "non-negative integer");

// A duration flag: a finite number of seconds above 0 (0 or a negative one
// would otherwise be taken for "not given" and silently mean the default).
inline const CLI::Validator kPositiveSeconds(
    [](std::string& v) {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      return !v.empty() && end == v.c_str() + v.size() && std::isfinite(x) && x > 0
                 ? std::string()
                 : "must be a positive number of seconds, got '" + v + "'";
    },
    "", "seconds > 0");

void add_train(CLI::App& app);
void add_eval(CLI::App& app);
void add_forward(CLI::App& app);
void add_backward(CLI::App& app);
void add_export_hf(CLI::App& app);
void add_import_hf(CLI::App& app);
void add_info(CLI::App& app);
void add_bench(CLI::App& app);
void add_inspect(CLI::App& app);
void add_generate(CLI::App& app);
void add_bench_attention(CLI::App& app);
void add_bench_gemm(CLI::App& app);
void add_tokenizer(CLI::App& app);
void add_data(CLI::App& app);
void add_dist_check(CLI::App& app);  // hidden
void add_dist_selftest(CLI::App& app);  // hidden

}  // namespace kvs::cli
