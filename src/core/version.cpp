#include "core/version.h"

#ifndef KVS_GIT_COMMIT
#define KVS_GIT_COMMIT "unknown"
#endif

namespace kvs {

const char* git_commit() { return KVS_GIT_COMMIT[0] ? KVS_GIT_COMMIT : "unknown"; }

}  // namespace kvs
