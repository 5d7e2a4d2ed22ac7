/* ds_output_check: an output path is refused when writing it would replace or write into one
 * of the command's inputs. Paths are compared resolved (symlinks followed, "." and ".."
 * applied) so that another spelling of an input is recognized; the output may not exist yet. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dspark/fileio.h"

enum { MAX_LINKS = 40 };

/* Appends "/name" (n bytes) to cur (capacity PATH_MAX); 0 when it would not fit. */
static int push_component(char *cur, const char *name, size_t n) {
  size_t len = strlen(cur);
  if (len + 1 + n >= PATH_MAX) return 0;
  if (len != 1 || cur[0] != '/') cur[len++] = '/';
  memcpy(cur + len, name, n);
  cur[len + n] = 0;
  return 1;
}

static void pop_component(char *cur) {
  char *slash = strrchr(cur, '/');
  if (slash == cur) cur[1] = 0; /* "/x" -> "/", and ".." of "/" stays "/" */
  else if (slash) *slash = 0;
}

/* The absolute path `path` names, component by component: an existing symlink is replaced by
 * its target (a dangling one too: writing through it would create the target), ".." drops the
 * resolved parent; past the first missing component the rest is applied as text, as mkdir -p
 * and a later open would. out holds PATH_MAX bytes. */
static ds_status resolve_path(const char *path, char *out) {
  char *todo = ds_malloc(PATH_MAX * 2, "path");
  if (!todo) return DS_ERR_NOMEM;
  if (strlen(path) >= PATH_MAX) {
    free(todo);
    return DS_FAIL(DS_ERR_IO, "%s: path too long", path);
  }
  strcpy(todo, path);
  if (path[0] == '/') strcpy(out, "/");
  else if (!getcwd(out, PATH_MAX)) {
    free(todo);
    return DS_FAIL(DS_ERR_IO, "cannot read the working directory: %s", strerror(errno));
  }
  int links = 0, missing = 0;
  ds_status st = DS_OK;
  size_t at = 0;
  while (st == DS_OK && todo[at]) {
    while (todo[at] == '/') at++;
    size_t n = strcspn(todo + at, "/");
    const char *name = todo + at;
    at += n;
    if (n == 0 || (n == 1 && name[0] == '.')) continue;
    if (n == 2 && name[0] == '.' && name[1] == '.') {
      pop_component(out);
      continue;
    }
    if (!push_component(out, name, n)) {
      st = DS_FAIL(DS_ERR_IO, "%s: path too long", path);
      break;
    }
    struct stat sb;
    if (missing) continue;
    if (lstat(out, &sb) != 0) {
      missing = 1;
      continue;
    }
    if (!S_ISLNK(sb.st_mode)) continue;
    char target[PATH_MAX];
    ssize_t tn = readlink(out, target, sizeof target - 1);
    if (tn < 0 || ++links > MAX_LINKS) {
      st = DS_FAIL(DS_ERR_IO, "%s: cannot be resolved: %s", path, tn < 0 ? strerror(errno) : strerror(ELOOP));
      break;
    }
    target[tn] = 0;
    size_t rest = strlen(todo + at);
    if ((size_t)tn + 1 + rest >= PATH_MAX * 2) {
      st = DS_FAIL(DS_ERR_IO, "%s: path too long", path);
      break;
    }
    /* the link's target, then what followed it */
    memmove(todo + tn + 1, todo + at, rest + 1);
    memcpy(todo, target, (size_t)tn);
    todo[tn] = '/';
    at = 0;
    if (target[0] == '/') strcpy(out, "/");
    else pop_component(out);
  }
  free(todo);
  return st;
}

/* child lies strictly below dir (both resolved). */
static int lies_inside(const char *child, const char *dir) {
  size_t n = strlen(dir);
  if (n == 1 && dir[0] == '/') return child[1] != 0;
  return strncmp(child, dir, n) == 0 && child[n] == '/';
}

ds_status ds_output_check(const char *option, const char *path, ds_output_kind kind, const ds_input_path *inputs,
                          size_t n_inputs) {
  const char *opt = option ? option : "the output";
  struct stat out_sb;
  int out_exists = stat(path, &out_sb) == 0;
  if (out_exists && kind == DS_OUTPUT_FILE && S_ISDIR(out_sb.st_mode))
    return DS_FAIL(DS_ERR_IO, "%s %s is a directory: give the path of a file to write", opt, path);
  if (out_exists && kind == DS_OUTPUT_DIR && !S_ISDIR(out_sb.st_mode))
    return DS_FAIL(DS_ERR_IO, "%s %s exists and is not a directory", opt, path);
  char *out_res = ds_malloc(PATH_MAX, "path"), *in_res = ds_malloc(PATH_MAX, "path");
  ds_status st = out_res && in_res ? resolve_path(path, out_res) : DS_ERR_NOMEM;
  if (st != DS_OK && st != DS_ERR_NOMEM) ds_error_wrap(st, "%s", opt);
  for (size_t i = 0; st == DS_OK && i < n_inputs; i++) {
    const ds_input_path *in = &inputs[i];
    struct stat in_sb;
    if (!in->path || stat(in->path, &in_sb) != 0) continue; /* absent: the command reports it */
    if ((st = resolve_path(in->path, in_res)) != DS_OK) {
      if (st != DS_ERR_NOMEM) ds_error_wrap(st, "%s", in->option);
      break;
    }
    int in_dir = S_ISDIR(in_sb.st_mode);
    const char *what = in_dir ? "directory" : "input file";
    int same = !strcmp(out_res, in_res) ||
               (out_exists && out_sb.st_dev == in_sb.st_dev && out_sb.st_ino == in_sb.st_ino);
    if (same)
      st = DS_FAIL(DS_ERR_ARG, "%s %s is the %s %s %s: refusing to overwrite an input", opt, path, in->option, what,
                   in->path);
    else if (in_dir && lies_inside(out_res, in_res))
      st = DS_FAIL(DS_ERR_ARG, "%s %s lies inside the %s directory %s: refusing to overwrite an input", opt, path,
                   in->option, in->path);
    else if (kind == DS_OUTPUT_DIR && lies_inside(in_res, out_res))
      st = DS_FAIL(DS_ERR_ARG, "%s %s holds the %s %s %s: refusing to write over an input", opt, path, in->option,
                   what, in->path);
  }
  free(out_res);
  free(in_res);
  return st;
}
