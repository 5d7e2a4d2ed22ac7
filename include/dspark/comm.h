/* The communication seam of data parallelism: the ranks of one job, all-reduce (sum), broadcast,
 * barrier and abort. Two implementations behind one table: a single process (every call a
 * no-op; also what a NULL ds_comm * means everywhere) and MPI (src/comm/comm_mpi.c, built when
 * DSPARK_MPI is ON); NCCL can join later as a third table.
 *
 * MPI is started only when the process was launched by mpirun (Open MPI's OMPI_COMM_WORLD_SIZE,
 * or PMI / PMIx variables of other launchers), so a plain `dspark train` never needs it. Every
 * rank must make the same sequence of collective calls; an error on one rank is ended with
 * ds_comm_abort (the program's main does it) so that the others never wait forever. MPI's own
 * errors (a peer that died) end the job through its default fatal error handler. */
#ifndef DSPARK_COMM_H
#define DSPARK_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_comm ds_comm;

/* What the collectives cost this process so far (for benchmarks and the metrics). */
typedef struct {
  int64_t allreduce_calls;
  double allreduce_bytes;  /* payload bytes handed to all-reduce (each rank's buffer) */
  double allreduce_s;      /* wall time inside all-reduce, waiting for the slowest rank included */
} ds_comm_stats;

/* The job's communicator: MPI's world when this build has MPI and mpirun launched us,
 * otherwise the single process. argc / argv may be NULL. */
ds_status ds_comm_open(int *argc, char ***argv, ds_comm **out);
/* Ends MPI (when it was started) and frees c; NULL is fine. */
void ds_comm_close(ds_comm *c);

/* Whether this build can run under mpirun (DSPARK_MPI). */
int ds_comm_mpi_built(void);
/* "single" or "mpi" */
const char *ds_comm_name(const ds_comm *c);
int ds_comm_rank(const ds_comm *c); /* 0 for NULL */
int ds_comm_size(const ds_comm *c); /* 1 for NULL */

/* In place: buf becomes the element-wise sum of every rank's buf (the same n everywhere). */
ds_status ds_comm_allreduce_sum_f32(ds_comm *c, float *buf, size_t n);
ds_status ds_comm_allreduce_sum_f64(ds_comm *c, double *buf, size_t n);
/* Root's bytes copied into every other rank's buf. */
ds_status ds_comm_broadcast(ds_comm *c, void *buf, size_t bytes, int root);
ds_status ds_comm_barrier(ds_comm *c);
/* Ends every process of the job with exit code `code` (a single process just exits): the one
 * way out of an error on one rank that the others cannot see. Only a program's main calls it. */
void ds_comm_abort(ds_comm *c, int code) __attribute__((noreturn));

const ds_comm_stats *ds_comm_get_stats(const ds_comm *c); /* NULL for NULL */

#ifdef __cplusplus
}
#endif
#endif
