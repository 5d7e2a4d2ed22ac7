/* Whole-file reads, read-only mappings and atomic writes (temp file, fsync, rename, fsync dir). */
#ifndef DSPARK_FILEIO_H
#define DSPARK_FILEIO_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads a whole file; *out is NUL-terminated (not counted in *len). Free with free(). */
ds_status ds_read_file(const char *path, char **out, size_t *len);

typedef struct {
  const unsigned char *data; /* NULL for an empty file */
  size_t size;
  int fd;
} ds_mapping;

ds_status ds_map_file(const char *path, ds_mapping *out);
void ds_unmap_file(ds_mapping *m);
/* Drops the pages of [p, p + n) from this process's resident memory when the range lies in a
 * mapping made by ds_map_file (read-only and private, never written): a later read faults them
 * in again from the file, so only the resident size changes. The whole pages inside the range
 * go; a range elsewhere (the heap, another mapping) is left alone. For data read once (a
 * checksum, a copy, a repacked weight) that would otherwise stay resident beside its copy. */
void ds_release_mapped_pages(const void *p, size_t n);

/* Streams chunks to "<path>.tmp.<pid>" and renames over path on commit; never leaves a
 * partial file at path. A full disk or any write error is reported naming the file. */
typedef struct {
  char *final_path;
  char *tmp_path;
  int fd;
} ds_atomic_file;

ds_status ds_atomic_open(ds_atomic_file *f, const char *path);
ds_status ds_atomic_write(ds_atomic_file *f, const void *data, size_t n);
ds_status ds_atomic_commit(ds_atomic_file *f); /* fsync, rename, fsync the directory */
void ds_atomic_abort(ds_atomic_file *f);       /* removes the temp file */

/* One-shot atomic write of a buffer. */
ds_status ds_write_file_atomic(const char *path, const void *data, size_t n);

/* Joins dir and name with '/'; returns a malloc'd string or NULL (error recorded). */
char *ds_path_join(const char *dir, const char *name);
int ds_file_exists(const char *path);
/* Whether path exists (symlinks followed): *exists = 1 when it does, 0 when it is absent (no
 * such entry). Anything else is an error naming the path and the reason, so a file that is
 * there but cannot be reached is never reported as missing: a symlink loop (ELOOP), a
 * symlink whose target is missing ("dangling"), permission denied on a directory, an I/O
 * error. Use it wherever "absent" selects a different path (model files, checkpoints). */
ds_status ds_path_probe(const char *path, int *exists);
/* 1 when path is a directory with no entry but "." and "..", or does not exist (an output that
 * may be written); 0 otherwise (an entry, or a file). */
int ds_dir_is_empty(const char *path);
/* mkdir -p: creates path and its missing parents (0755); an existing directory is fine. */
ds_status ds_mkdir_p(const char *path);

/* An input of a command for ds_output_check: a file or a directory, named by the option that
 * gave it ("--target", or a positional argument's name such as "RUN_DIR"). */
typedef struct {
  const char *option;
  const char *path; /* NULL (not given) is skipped, as is a path that does not exist */
} ds_input_path;

typedef enum {
  DS_OUTPUT_FILE, /* a file written or replaced at the path */
  DS_OUTPUT_DIR,  /* a directory the command creates or fills (a run, a cache, an export) */
} ds_output_kind;

/* Refuses (DS_ERR_ARG, the message naming the option and the input) an output that would
 * overwrite an input: one that resolves to an input file or directory, lies inside an input
 * directory, or, for a directory output, holds an input. Paths are compared resolved: symlinks
 * followed (dangling ones too), "." and ".." applied, a missing tail taken as written; a hard
 * link to an input file counts as the file. A file output that is an existing directory, or a
 * directory output that is an existing file, is refused too. option may be NULL ("the output"). */
ds_status ds_output_check(const char *option, const char *path, ds_output_kind kind, const ds_input_path *inputs,
                          size_t n_inputs);

/* One writer per directory: an exclusive flock on DIR/.lock, held until ds_dir_unlock or the
 * process ends (a killed writer releases it at once). The holder's pid is written into the
 * file, so a second writer is refused with "DIR: the WHAT is in use by another dspark process
 * (pid N)". what names the directory's role in that message ("run directory", "cache"). */
typedef struct {
  int fd; /* -1 when not held */
} ds_dir_lock;

ds_status ds_dir_lock_acquire(const char *dir, const char *what, ds_dir_lock *out);
void ds_dir_unlock(ds_dir_lock *l);
/* Removes DIR's "NAME.tmp.PID" files left by killed writers (atomic writes' temp files).
 * Call it while holding DIR's lock: then no live writer owns one. *removed may be NULL. */
ds_status ds_remove_stale_temps(const char *dir, int *removed);

#ifdef __cplusplus
}
#endif
#endif
