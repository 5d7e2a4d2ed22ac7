/* The comm seam (include/dspark/comm.h): dispatch, timing, and the single-process
 * implementation (every collective is the identity on one rank). */
#include <stdlib.h>

#include "comm/comm_internal.h"

static ds_status single_allreduce_f32(ds_comm *c, float *buf, size_t n) { return DS_OK; }
static ds_status single_allreduce_f64(ds_comm *c, double *buf, size_t n) { return DS_OK; }
static ds_status single_broadcast(ds_comm *c, void *buf, size_t bytes, int root) { return DS_OK; }
static ds_status single_barrier(ds_comm *c) { return DS_OK; }
static void single_abort(ds_comm *c, int code) { exit(code); }
static void single_close(ds_comm *c) {}

static const ds_comm_ops k_single = {"single", single_allreduce_f32, single_allreduce_f64, single_broadcast,
                                     single_barrier, single_abort, single_close};

int ds_comm_mpi_built(void) {
#if DSPARK_USE_MPI
  return 1;
#else
  return 0;
#endif
}

int ds_comm_mpi_launched(void) {
  static const char *const k_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};
  for (size_t i = 0; i < sizeof k_vars / sizeof k_vars[0]; i++)
    if (getenv(k_vars[i])) return 1;
  return 0;
}

ds_status ds_comm_open(int *argc, char ***argv, ds_comm **out) {
  *out = NULL;
#if !DSPARK_USE_MPI
  /* N copies of a single-process program would each run the whole job into the same files. */
  const char *n = getenv("OMPI_COMM_WORLD_SIZE");
  if (n && atoi(n) > 1)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "launched by mpirun with %s processes, but this dspark was built without "
                   "MPI (DSPARK_MPI=OFF; install libopenmpi-dev and rebuild), so each would run the whole job alone", n);
#endif
  ds_comm *c = ds_malloc(sizeof *c, "communicator");
  if (!c) return DS_ERR_NOMEM;
  *c = (ds_comm){&k_single, 0, 1, {0, 0, 0}};
#if DSPARK_USE_MPI
  if (ds_comm_mpi_launched()) {
    ds_status st = ds_comm_mpi_open(argc, argv, c);
    if (st != DS_OK) {
      free(c);
      return st;
    }
  }
#endif
  *out = c;
  return DS_OK;
}

void ds_comm_close(ds_comm *c) {
  if (!c) return;
  c->ops->close(c);
  free(c);
}

const char *ds_comm_name(const ds_comm *c) { return c ? c->ops->name : k_single.name; }
int ds_comm_rank(const ds_comm *c) { return c ? c->rank : 0; }
int ds_comm_size(const ds_comm *c) { return c ? c->size : 1; }
const ds_comm_stats *ds_comm_get_stats(const ds_comm *c) { return c ? &c->stats : NULL; }

/* One process: nothing to exchange and nothing to count (the stats measure communication). */
ds_status ds_comm_allreduce_sum_f32(ds_comm *c, float *buf, size_t n) {
  if (!c || c->size == 1) return DS_OK;
  double t0 = ds_time_sec();
  ds_status st = c->ops->allreduce_f32(c, buf, n);
  c->stats.allreduce_calls++;
  c->stats.allreduce_bytes += (double)n * sizeof *buf;
  c->stats.allreduce_s += ds_time_sec() - t0;
  return st;
}

ds_status ds_comm_allreduce_sum_f64(ds_comm *c, double *buf, size_t n) {
  if (!c || c->size == 1) return DS_OK;
  double t0 = ds_time_sec();
  ds_status st = c->ops->allreduce_f64(c, buf, n);
  c->stats.allreduce_calls++;
  c->stats.allreduce_bytes += (double)n * sizeof *buf;
  c->stats.allreduce_s += ds_time_sec() - t0;
  return st;
}

ds_status ds_comm_broadcast(ds_comm *c, void *buf, size_t bytes, int root) {
  if (!c || c->size == 1) return DS_OK;
  if (root < 0 || root >= c->size)
    return DS_FAIL(DS_ERR_ARG, "broadcast root %d is not a rank of this job (0..%d)", root, c->size - 1);
  return c->ops->broadcast(c, buf, bytes, root);
}

ds_status ds_comm_barrier(ds_comm *c) { return c && c->size > 1 ? c->ops->barrier(c) : DS_OK; }

void ds_comm_abort(ds_comm *c, int code) {
  if (c) c->ops->abort(c, code);
  exit(code); /* not reached for MPI */
}
