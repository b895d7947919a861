// Output directories that appear whole or not at all: build under
// "<dir>.tmp.<pid>" beside the target, then rename it into place. A killed
// run leaves only its ".tmp.<pid>" directory, which the next run removes. A
// target that is a symbolic link stands for the directory it names (built
// beside that one, which is replaced; the link stays).
#pragma once
#include <string>
#include <vector>

namespace kvs {

// The temp directory for `target` (created empty; a stale one of this pid is
// removed first). Also removes "<target>.tmp.<pid>" / "<target>.old.<pid>"
// siblings whose process no longer exists.
std::string begin_atomic_dir(const std::string& target);
// Before any work: removes what killed runs left beside `target` (as
// begin_atomic_dir does), then refuses an existing `target` without `force`
// ("already exists; pass --force to replace it"), and with it one that is not
// a directory holding `marker` (the file that marks the command's earlier
// output). An empty directory is taken without `force`.
void check_atomic_target(const std::string& target, bool force, const char* marker);
// Renames `tmp` to `target`; an existing `target` is replaced only as
// check_atomic_target allows (moved aside, then deleted; moved back if the
// rename fails).
void commit_atomic_dir(const std::string& tmp, const std::string& target, bool force, const char* marker);
// Best-effort removal of `tmp` after a failure.
void abandon_atomic_dir(const std::string& tmp);
// Refuses an output directory that is, or contains, one of the inputs: with
// --force it would be deleted before (or while) they are read. The error
// names `flag` and the input.
void check_output_holds_no_input(const std::string& out, const std::vector<std::string>& inputs,
                                 const std::string& flag = "--out");
// Refuses an output file that is one of the inputs or lies inside an input
// directory (`forward --out` into the checkpoint it reads would replace its
// weights). The error names `flag` and the input.
void check_output_file_apart_from_inputs(const std::string& out, const std::vector<std::string>& inputs,
                                         const std::string& flag = "--out");

}  // namespace kvs
