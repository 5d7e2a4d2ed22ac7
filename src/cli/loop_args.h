/* The options every training command shares (ds_loop_options, include/dspark/trainer.h):
 * --out, --steps, --batch-seqs, --lr, --warmup, --weight-decay, --grad-clip, --seed,
 * --skip-nonfinite, --save-every, --eval-every, --resume, --overwrite, --stop-after,
 * --inject-nan-step, --threads, --quiet, --profile; parsed one way for train, pretrain and distill. */
#ifndef DSPARK_CLI_LOOP_ARGS_H
#define DSPARK_CLI_LOOP_ARGS_H

#include "dspark/trainer.h"

/* argv[*i] if it is a loop option: consumes it (and its value) and returns 1; returns 0 when
 * it is not one; -1 after a usage message (the command exits 2). */
int cli_loop_option(int argc, char **argv, int *i, ds_loop_options *l);
/* Checks after parsing (--out given, --resume with --overwrite): 1 ok, 0 after a message.
 * Attaches the job's communicator; ranks other than 0 are quiet (rank 0 reports for all). */
int cli_loop_check(const char *command, ds_loop_options *l);
/* The usage lines of these options. */
extern const char *const cli_loop_usage;

#endif
