// Writing a file that other processes read while it changes (a Prometheus file_sd target list,
// a ready file): readers see the old contents or the new, never a partial file.
#ifndef VAMP_COMMON_ATOMIC_FILE_H_
#define VAMP_COMMON_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace vamp {

// Writes `contents` to a temporary file next to `path` (same directory, so the rename cannot
// cross file systems), flushes it to disk and renames it over `path` (rename(2) is atomic). The
// temporary name is unique per process and call, so concurrent writers never share one; a failed
// write removes it. Errors name the path and the system's reason.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace vamp

#endif  // VAMP_COMMON_ATOMIC_FILE_H_
