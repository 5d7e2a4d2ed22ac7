/* Backends by name, for the command line's --device (include/dspark/backend.h). */
#include <string.h>

#include "dspark/backend.h"
#include "dspark/common.h"

const ds_backend *ds_backend_named(const char *name) {
  if (!strcmp(name, "cpu")) return ds_backend_cpu();
  if (!strcmp(name, "cuda")) return ds_backend_cuda(); /* NULL with its reason when it cannot run */
  DS_FAIL(DS_ERR_ARG, "unknown device '%s' (cpu or cuda)", name);
  return NULL;
}
