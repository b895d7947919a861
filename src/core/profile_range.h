// Named ranges for a profiler's timeline: `ProfileRange r("optimizer");` marks
// the enclosing scope, `ProfileRange r("forward layer", l)` also carries the
// layer index as the range's payload (no string formatting per call). Built
// with the CUDA backend they are NVTX ranges (the toolkit's header-only nvtx3,
// which costs a branch when no tool is attached), so an `nsys profile` of a
// training step reads by phase: data, forward/backward per layer, the loss,
// gradient reductions, the optimizer. Without CUDA they compile to nothing.
#pragma once
#ifdef KVS_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace kvs {

class ProfileRange {
 public:
#ifdef KVS_CUDA
  explicit ProfileRange(const char* name) { nvtxRangePushA(name); }
  ProfileRange(const char* name, long long index) {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = index;
    nvtxRangePushEx(&a);
  }
  ~ProfileRange() { nvtxRangePop(); }
#else
  explicit ProfileRange(const char*) {}
  ProfileRange(const char*, long long) {}
#endif
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;
};

}  // namespace kvs
