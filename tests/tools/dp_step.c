/* One step of the trainer core on a toy objective, for tests/conformance/test_mpi.py: the
 * gradient a data-parallel step applies, next to the two answers it could be compared with.
 *
 *   dp_step RUN_DIR            (alone, or under mpirun -np N)
 *
 * The toy: a vector p [P] fit to per-token targets; training item i holds n_i supervised tokens
 * (uneven: 1, 6, 2, 7, ...), token t with target y(i, t), loss numerator sum_t |p - y(i,t)|^2,
 * denominator n_i. One step of 4 items (on 2 ranks: 2 micro-batches each) with clipping off.
 * Rank 0 prints one JSON line:
 *   "world"          the number of ranks
 *   "grad"           the gradient the step applied (summed over ranks by the core)
 *   "full_batch"     the closed-form gradient of the whole step's batch under global token
 *                    normalization: sum over the step's tokens of 2 (p - y) / (sum of n_i)
 *   "mean_of_means"  the per-micro-batch-normalized variant: the mean over items of each
 *                    item's own 2 (p - y) / n_i (the bug spec section 4 warns of)
 *   "loss"           the step's reported loss (numerator / denominator after the reduction) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/comm.h"
#include "dspark/trainer.h"

enum { P = 5, N_TRAIN = 8, MAX_TOKENS = 8, BATCH = 4 };

typedef struct {
  float p[P], g[P];
  int64_t step0_items[BATCH]; /* the indices of step 0, as weight() saw them (every rank sees all) */
} toy;

static int tokens_of(int64_t i) { return 1 + (int)((i * 5) % 7); }
static double target(int64_t i, int t, int k) { return sin(0.3 + 1.1 * (double)i + 0.7 * t + 1.9 * k); }

static ds_status toy_setup(void *self, ds_objective *obj) {
  obj->n_train = N_TRAIN;
  obj->n_eval = 0;
  obj->train_config = "{\"objective\": \"dp-toy\"}";
  obj->run_info = NULL;
  obj->data_label = "toy data";
  return DS_OK;
}

static ds_status toy_init(void *self, uint64_t seed) {
  toy *t = self;
  for (int k = 0; k < P; k++) t->p[k] = 0.1f * (float)k - 0.2f;
  return DS_OK;
}

static ds_status toy_load(void *self, const ds_safetensors *ck) {
  return DS_FAIL(DS_ERR_UNSUPPORTED, "dp_step does not resume");
}
static ds_status toy_start(void *self, const ds_trainer *core) { return DS_OK; }
static float *toy_params(void *self) { return ((toy *)self)->p; }
static float *toy_grads(void *self) { return ((toy *)self)->g; }
static size_t toy_num_params(void *self) { return P; }
static void toy_zero_grads(void *self) { memset(((toy *)self)->g, 0, sizeof ((toy *)self)->g); }

static ds_status toy_weight(void *self, const ds_step_item *it, double *w) {
  if (it->step == 0 && it->j < BATCH) ((toy *)self)->step0_items[it->j] = it->index;
  *w = tokens_of(it->index);
  return DS_OK;
}

static ds_status toy_micro_step(void *self, const ds_step_item *it, double W, ds_report *r) {
  toy *t = self;
  if (W <= 0) return DS_OK;
  int n = tokens_of(it->index);
  for (int tok = 0; tok < n; tok++)
    for (int k = 0; k < P; k++) {
      double d = (double)t->p[k] - target(it->index, tok, k);
      t->g[k] += (float)(2.0 * d / W);
      r->numerator += d * d;
      r->pair[0][0] += d * d;
    }
  r->W += n;
  r->num_tokens += n;
  r->seen_tokens += n;
  r->pair[0][1] += n;
  r->pair_present[0] = 1;
  return DS_OK;
}

static ds_status toy_eval_item(void *self, int64_t e, ds_report *r) { return DS_OK; }

static ds_status toy_save(void *self, ds_st_writer *w) {
  int64_t n = P;
  return ds_st_writer_add(w, "toy.p", DS_F32, 1, &n, ((toy *)self)->p);
}

static const char *const k_pairs[1] = {"loss"};

static const ds_objective_ops k_toy_ops = {
    .name = "dp-toy", .checkpoint_format = "dp-toy-checkpoint", .pair_names = k_pairs, .n_pairs = 1,
    .progress_pair = -1, .setup = toy_setup, .init = toy_init, .load = toy_load, .start = toy_start,
    .params = toy_params, .grads = toy_grads, .num_params = toy_num_params, .zero_grads = toy_zero_grads,
    .weight = toy_weight, .micro_step = toy_micro_step, .eval_item = toy_eval_item, .save = toy_save,
};

static void print_vec(const char *name, const double *v) {
  printf("\"%s\": [", name);
  for (int k = 0; k < P; k++) printf("%s%.17g", k ? ", " : "", v[k]);
  printf("]");
}

int main(int argc, char **argv) {
  ds_comm *comm = NULL;
  if (ds_comm_open(&argc, &argv, &comm) != DS_OK || argc != 2) {
    fprintf(stderr, "usage: dp_step RUN_DIR (%s)\n", ds_last_error());
    return 2;
  }
  toy t;
  memset(&t, 0, sizeof t);
  ds_loop_options o;
  ds_loop_options_default(&o);
  o.out_dir = argv[1];
  o.overwrite = 1;
  o.steps = 1;
  o.batch_items = BATCH;
  o.grad_clip = 0;
  o.eval_every = 0;
  o.quiet = 1;
  o.seed = 11;
  o.comm = comm;
  toy_init(&t, 0);
  float p0[P];
  memcpy(p0, t.p, sizeof p0);
  ds_objective obj = {&k_toy_ops, &t, 0, 0, NULL, NULL, NULL};
  if (ds_trainer_run(&obj, &o) != DS_OK) {
    fprintf(stderr, "dp_step (rank %d): %s\n", ds_comm_rank(comm), ds_last_error());
    ds_comm_abort(comm, 1);
  }
  if (ds_comm_rank(comm) == 0) {
    double grad[P], full[P] = {0}, mom[P] = {0}, W = 0, num = 0;
    for (int j = 0; j < BATCH; j++) W += tokens_of(t.step0_items[j]);
    for (int j = 0; j < BATCH; j++) {
      int64_t i = t.step0_items[j];
      int n = tokens_of(i);
      for (int tok = 0; tok < n; tok++)
        for (int k = 0; k < P; k++) {
          double d = (double)p0[k] - target(i, tok, k);
          full[k] += 2.0 * d / W;
          mom[k] += 2.0 * d / n / BATCH;
          num += d * d;
        }
    }
    for (int k = 0; k < P; k++) grad[k] = t.g[k];
    printf("{\"world\": %d, \"loss_closed_form\": %.17g, ", ds_comm_size(comm), num / W);
    print_vec("grad", grad);
    printf(", ");
    print_vec("full_batch", full);
    printf(", ");
    print_vec("mean_of_means", mom);
    printf("}\n");
  }
  ds_comm_close(comm);
  return 0;
}
