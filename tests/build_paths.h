// Where this build's source tree and the kvshift binary under test are (absolute paths).
// CMake generates the definitions, one small file per test binary (kvs_add_test_paths in
// CMakeLists.txt): passed as -D flags, the paths made every test file's compile depend on
// where the clone is, and ccache could not reuse them in CI's fresh clones.
#pragma once

namespace kvs::test {
const char* source_dir();
const char* cli_binary();
}  // namespace kvs::test
