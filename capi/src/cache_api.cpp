// Managed cache (layer 3): temporary placeholder until core/managed_cache lands.
#include "capi/src/shim.h"
