/* The subcommands of the `dspark` program; each lives in its own cmd_*.c file. A command
 * returns the process exit status: 0 success, 1 runtime error, 2 usage error. */
#ifndef DSPARK_CLI_COMMANDS_H
#define DSPARK_CLI_COMMANDS_H

int cmd_info(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_loss(int argc, char **argv);
int cmd_speculate(int argc, char **argv);
int cmd_regenerate(int argc, char **argv);
int cmd_pretrain(int argc, char **argv);
int cmd_distill(int argc, char **argv);
int cmd_kd_loss(int argc, char **argv);
int cmd_draft_forward(int argc, char **argv);
int cmd_capture(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_profile(int argc, char **argv);

/* The job's communicator (include/dspark/comm.h): MPI's world under mpirun, else the single
 * process. Opened by main before the command runs. */
struct ds_comm *cli_comm(void);

/* 1 when the command line gave --weights (taken out of argv by main for the commands that take
 * it; its value set with ds_set_target_weights). */
int cli_weights_given(void);

/* Prints "dspark: <status>: <message>" for the thread's last error and returns 1. */
int cli_report_error(const char *what);

#endif
