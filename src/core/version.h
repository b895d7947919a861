// What built this binary, for manifests: the git commit of the source tree at
// configure time ("unknown" outside a git checkout).
#pragma once

namespace kvs {

const char* git_commit();

}  // namespace kvs
