// Status propagation helpers. Across module boundaries VAMP returns absl::Status or
// absl::StatusOr<T>; no exception crosses a module boundary.
#ifndef VAMP_COMMON_STATUS_MACROS_H_
#define VAMP_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define VAMP_STATUS_CONCAT_INNER_(a, b) a##b
#define VAMP_STATUS_CONCAT_(a, b) VAMP_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function with `expr`'s status when it is not OK.
#define VAMP_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::absl::Status vamp_status_ = (expr);          \
    if (!vamp_status_.ok()) return vamp_status_;   \
  } while (0)

// `VAMP_ASSIGN_OR_RETURN(auto x, Foo());` binds the value of an OK StatusOr, or returns its status.
#define VAMP_ASSIGN_OR_RETURN(lhs, rexpr) \
  VAMP_ASSIGN_OR_RETURN_IMPL_(VAMP_STATUS_CONCAT_(vamp_statusor_, __LINE__), lhs, rexpr)
#define VAMP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return statusor.status();           \
  lhs = std::move(statusor).value()

namespace vamp {

// `s` with `prefix` before its message (OK stays OK).
inline absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// `s` with code `code` and `prefix` before its message (OK stays OK).
inline absl::Status WithCode(const absl::Status& s, absl::StatusCode code,
                             absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(code, absl::StrCat(prefix, s.message()));
}

}  // namespace vamp

#endif  // VAMP_COMMON_STATUS_MACROS_H_
