// CUDA device discovery, compiled only with -DKVS_CUDA=ON. The CUDA engine
// (issue 4) will live beside this file and mirror model/cpu_engine.cpp.
#pragma once
#include <string>

namespace kvs::cuda {

// Number of visible CUDA devices; 0 (and `why` filled) when there is none or
// the driver cannot be used.
int device_count(std::string* why);
std::string device_name(int index);

}  // namespace kvs::cuda
