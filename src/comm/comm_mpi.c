/* The comm seam over MPI (include/dspark/comm.h), compiled when DSPARK_MPI is ON. Only the
 * main thread calls MPI (MPI_THREAD_FUNNELED): OpenMP workers and prefetch threads never do.
 * MPI counts are int, so large buffers go in chunks. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include "comm/comm_internal.h"

enum { CHUNK = INT_MAX / 8 }; /* elements (or bytes) per MPI call */

static ds_status mpi_fail(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = 0;
  return DS_FAIL(DS_ERR_IO, "MPI %s failed: %s", what, len ? msg : "unknown error");
}

/* Sums n elements of `size` bytes in place over the ranks, CHUNK elements per call. */
static ds_status allreduce_sum(void *buf, size_t n, size_t size, MPI_Datatype type) {
  for (size_t at = 0; at < n; at += CHUNK) {
    int k = (int)(n - at < CHUNK ? n - at : CHUNK);
    int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + at * size, k, type, MPI_SUM, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "all-reduce");
  }
  return DS_OK;
}

static ds_status mpi_allreduce_f32(ds_comm *c, float *buf, size_t n) {
  return allreduce_sum(buf, n, sizeof *buf, MPI_FLOAT);
}

static ds_status mpi_allreduce_f64(ds_comm *c, double *buf, size_t n) {
  return allreduce_sum(buf, n, sizeof *buf, MPI_DOUBLE);
}

static ds_status mpi_broadcast(ds_comm *c, void *buf, size_t bytes, int root) {
  for (size_t at = 0; at < bytes; at += CHUNK) {
    int k = (int)(bytes - at < CHUNK ? bytes - at : CHUNK);
    int rc = MPI_Bcast((char *)buf + at, k, MPI_BYTE, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "broadcast");
  }
  return DS_OK;
}

static ds_status mpi_barrier(ds_comm *c) {
  int rc = MPI_Barrier(MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? DS_OK : mpi_fail(rc, "barrier");
}

static void mpi_abort(ds_comm *c, int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

static void mpi_close(ds_comm *c) {
  int done = 0;
  if (MPI_Finalized(&done) == MPI_SUCCESS && !done) MPI_Finalize();
}

static const ds_comm_ops k_mpi = {"mpi", mpi_allreduce_f32, mpi_allreduce_f64, mpi_broadcast,
                                  mpi_barrier, mpi_abort, mpi_close};

ds_status ds_comm_mpi_open(int *argc, char ***argv, ds_comm *c) {
  int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "initialization");
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    return DS_FAIL(DS_ERR_UNSUPPORTED, "this MPI library does not allow threads next to MPI (MPI_THREAD_FUNNELED)");
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  c->ops = &k_mpi;
  c->rank = rank;
  c->size = size;
  return DS_OK;
}
