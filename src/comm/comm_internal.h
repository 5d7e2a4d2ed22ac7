/* The comm seam's implementation table (include/dspark/comm.h). Not a public header. */
#ifndef DSPARK_COMM_INTERNAL_H
#define DSPARK_COMM_INTERNAL_H

#include "dspark/comm.h"

typedef struct {
  const char *name;
  ds_status (*allreduce_f32)(ds_comm *c, float *buf, size_t n);
  ds_status (*allreduce_f64)(ds_comm *c, double *buf, size_t n);
  ds_status (*broadcast)(ds_comm *c, void *buf, size_t bytes, int root);
  ds_status (*barrier)(ds_comm *c);
  void (*abort)(ds_comm *c, int code);
  void (*close)(ds_comm *c);
} ds_comm_ops;

struct ds_comm {
  const ds_comm_ops *ops;
  int rank, size;
  ds_comm_stats stats;
};

/* Whether the environment says a launcher (mpirun) started this process. */
int ds_comm_mpi_launched(void);

#if DSPARK_USE_MPI
/* MPI_Init_thread and the world communicator into c. */
ds_status ds_comm_mpi_open(int *argc, char ***argv, ds_comm *c);
#endif

#endif
