/* Small helpers shared by the subcommands for option values; each prints a usage error that
 * names the option and returns 0 on bad input. */
#ifndef DSPARK_CLI_ARGS_H
#define DSPARK_CLI_ARGS_H

#include <stdint.h>

/* argv[*i] is an option that takes a value: returns argv[*i + 1] and advances *i, or NULL. */
const char *cli_value(int argc, char **argv, int *i);
int cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_float(const char *opt, const char *s, double lo, double hi, double *out);
/* "1,2,3" -> malloc'd array; returns 0 on a malformed list. */
int cli_int_list(const char *opt, const char *s, int32_t **out, int64_t *n);
int cli_is_help(const char *arg);

#endif
