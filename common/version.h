// The VAMP version string, set by the build (project(VERSION) in the top-level CMakeLists.txt).
#ifndef VAMP_COMMON_VERSION_H_
#define VAMP_COMMON_VERSION_H_

namespace vamp {

#ifndef VAMP_VERSION_STRING
#define VAMP_VERSION_STRING "0.0.0-dev"
#endif

inline constexpr char kVersion[] = VAMP_VERSION_STRING;

}  // namespace vamp

#endif  // VAMP_COMMON_VERSION_H_
