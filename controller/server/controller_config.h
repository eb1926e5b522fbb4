// vamp-controller's configuration schema: every flag, its default and its range.
#ifndef VAMP_CONTROLLER_SERVER_CONTROLLER_CONFIG_H_
#define VAMP_CONTROLLER_SERVER_CONTROLLER_CONFIG_H_

#include "common/config.h"

namespace vamp {

// The schema of vamp-controller's flags and config file (see `vamp-controller --help`).
const ConfigSchema& ControllerConfigSchema();

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVER_CONTROLLER_CONFIG_H_
