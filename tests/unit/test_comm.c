/* The comm seam's single-process side (include/dspark/comm.h): what every plain run and every
 * build without MPI uses. A NULL communicator and the one ds_comm_open gives outside mpirun are
 * rank 0 of 1, and every collective leaves the data as it is and counts nothing. (The MPI
 * side: conformance.test_mpi.) */
#include <stdlib.h>
#include <string.h>

#include "dspark/comm.h"
#include "test_util.h"

static void check_single(ds_comm *c) {
  EXPECT(ds_comm_rank(c) == 0);
  EXPECT(ds_comm_size(c) == 1);
  EXPECT(!strcmp(ds_comm_name(c), "single"));
  float f[3] = {1.5f, -2.0f, 3.25f};
  double d[2] = {0.1, 1e300};
  char bytes[4] = "abc";
  EXPECT_OK(ds_comm_allreduce_sum_f32(c, f, 3));
  EXPECT_OK(ds_comm_allreduce_sum_f64(c, d, 2));
  EXPECT_OK(ds_comm_broadcast(c, bytes, sizeof bytes, 0));
  EXPECT_OK(ds_comm_barrier(c));
  EXPECT(f[0] == 1.5f && f[1] == -2.0f && f[2] == 3.25f);
  EXPECT(d[0] == 0.1 && d[1] == 1e300);
  EXPECT(!strcmp(bytes, "abc"));
  const ds_comm_stats *s = ds_comm_get_stats(c);
  EXPECT(c ? s && s->allreduce_calls == 0 && s->allreduce_bytes == 0 : s == NULL);
}

static void test_null_is_one_process(void) { check_single(NULL); }

static void test_open_outside_mpirun(void) {
  /* the variables a launcher sets: none here, so no MPI even in an MPI build */
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("PMIX_RANK");
  unsetenv("PMI_SIZE");
  unsetenv("PMI_RANK");
  ds_comm *c = NULL;
  EXPECT_OK(ds_comm_open(NULL, NULL, &c));
  EXPECT(c != NULL);
  check_single(c);
  ds_comm_close(c);
  ds_comm_close(NULL);
}

int main(void) {
  TEST_RUN(test_null_is_one_process);
  TEST_RUN(test_open_outside_mpirun);
  return TEST_RESULT();
}
