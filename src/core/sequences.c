#include "dspark/sequences.h"

#include <stdlib.h>
#include <string.h>

void ds_dataset_free(ds_dataset *ds) {
  free(ds->ids);
  free(ds->loss_mask);
  free(ds->lengths);
  memset(ds, 0, sizeof *ds);
}
