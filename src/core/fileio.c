#define _GNU_SOURCE
#include "dspark/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reason an opened path cannot be read as a file: fstat failed (err), or what it is. */
static ds_status not_regular(const char *path, const struct stat *st, int err) {
  if (err) return DS_FAIL(DS_ERR_IO, "%s: cannot stat: %s", path, strerror(err));
  return DS_FAIL(DS_ERR_IO, "%s: %s, not a regular file", path,
                 S_ISDIR(st->st_mode) ? "a directory" : S_ISFIFO(st->st_mode) ? "a pipe" : "a device or socket");
}

ds_status ds_read_file(const char *path, char **out, size_t *len) {
  *out = NULL;
  if (len) *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return DS_FAIL(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  int err = fstat(fd, &st) != 0 ? errno : 0;
  if (err || !S_ISREG(st.st_mode)) {
    ds_status s = not_regular(path, &st, err);
    close(fd);
    return s;
  }
  size_t size = (size_t)st.st_size;
  char *buf = ds_malloc(size + 1, path);
  if (!buf) { close(fd); return DS_ERR_NOMEM; }
  size_t got = 0;
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ds_status s = DS_FAIL(DS_ERR_IO, "%s: read failed after %zu of %zu bytes: %s", path, got, size,
                            r < 0 ? strerror(errno) : "the file shrank while being read");
      free(buf);
      close(fd);
      return s;
    }
    got += (size_t)r;
  }
  close(fd);
  buf[size] = 0;
  *out = buf;
  if (len) *len = size;
  return DS_OK;
}

/* The live ds_map_file mappings, for ds_release_mapped_pages (few: a model, a checkpoint, a cache shard). */
static pthread_mutex_t g_maps_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { const unsigned char *data; size_t size; } *g_maps;
static size_t g_n_maps, g_cap_maps;

static void maps_add(const unsigned char *data, size_t size) {
  pthread_mutex_lock(&g_maps_lock);
  if (g_n_maps == g_cap_maps) {
    size_t cap = g_cap_maps ? 2 * g_cap_maps : 16;
    void *p = realloc(g_maps, cap * sizeof *g_maps);
    if (p) g_maps = p, g_cap_maps = cap;
  }
  if (g_n_maps < g_cap_maps) g_maps[g_n_maps].data = data, g_maps[g_n_maps++].size = size; /* else never released */
  pthread_mutex_unlock(&g_maps_lock);
}

void ds_release_mapped_pages(const void *p, size_t n) {
  if (!p || !n) return;
  uintptr_t a = (uintptr_t)p, b = a + n, page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);
  /* under the lock: ds_unmap_file cannot unmap the range (and something else map there) meanwhile */
  pthread_mutex_lock(&g_maps_lock);
  int inside = 0;
  for (size_t i = 0; i < g_n_maps && !inside; i++)
    inside = a >= (uintptr_t)g_maps[i].data && b <= (uintptr_t)g_maps[i].data + g_maps[i].size;
  if (inside && hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: a failure changes nothing */
  pthread_mutex_unlock(&g_maps_lock);
}

ds_status ds_map_file(const char *path, ds_mapping *out) {
  memset(out, 0, sizeof *out);
  out->fd = -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return DS_FAIL(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  int err = fstat(fd, &st) != 0 ? errno : 0;
  if (err || !S_ISREG(st.st_mode)) {
    ds_status s = not_regular(path, &st, err);
    close(fd);
    return s;
  }
  out->fd = fd;
  out->size = (size_t)st.st_size;
  if (out->size == 0) return DS_OK;
  void *p = mmap(NULL, out->size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    out->fd = -1;
    return DS_FAIL(DS_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, out->size, strerror(errno));
  }
  out->data = p;
  maps_add(p, out->size);
  return DS_OK;
}

void ds_unmap_file(ds_mapping *m) {
  if (m->data) {
    pthread_mutex_lock(&g_maps_lock); /* held across munmap: see ds_release_mapped_pages */
    for (size_t i = 0; i < g_n_maps; i++)
      if (g_maps[i].data == m->data) {
        g_maps[i] = g_maps[--g_n_maps];
        break;
      }
    munmap((void *)m->data, m->size);
    pthread_mutex_unlock(&g_maps_lock);
  }
  if (m->fd >= 0) close(m->fd);
  m->data = NULL;
  m->size = 0;
  m->fd = -1;
}

ds_status ds_atomic_open(ds_atomic_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  size_t n = strlen(path) + 32;
  f->final_path = ds_malloc(strlen(path) + 1, "path");
  f->tmp_path = ds_malloc(n, "path");
  if (!f->final_path || !f->tmp_path) { ds_atomic_abort(f); return DS_ERR_NOMEM; }
  strcpy(f->final_path, path);
  snprintf(f->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
  f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    ds_status st = DS_FAIL(DS_ERR_IO, "%s: cannot create: %s", f->tmp_path, strerror(errno));
    ds_atomic_abort(f);
    return st;
  }
  return DS_OK;
}

ds_status ds_atomic_write(ds_atomic_file *f, const void *data, size_t n) {
  const char *p = data;
  while (n > 0) {
    ssize_t w = write(f->fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return DS_FAIL(DS_ERR_IO, "%s: write failed: %s (nothing was written to %s)", f->tmp_path,
                     w < 0 ? strerror(errno) : "no progress", f->final_path);
    p += w;
    n -= (size_t)w;
  }
  return DS_OK;
}

ds_status ds_atomic_commit(ds_atomic_file *f) {
  ds_status st = DS_OK;
  if (fsync(f->fd) != 0)
    st = DS_FAIL(DS_ERR_IO, "%s: fsync failed: %s", f->tmp_path, strerror(errno));
  if (close(f->fd) != 0 && st == DS_OK)
    st = DS_FAIL(DS_ERR_IO, "%s: close failed: %s", f->tmp_path, strerror(errno));
  f->fd = -1;
  if (st == DS_OK && rename(f->tmp_path, f->final_path) != 0)
    st = DS_FAIL(DS_ERR_IO, "%s: rename to %s failed: %s", f->tmp_path, f->final_path, strerror(errno));
  if (st == DS_OK) {
    char *dirbuf = strdup(f->final_path);
    int dfd = dirbuf ? open(dirname(dirbuf), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) { fsync(dfd); close(dfd); }
    free(dirbuf);
    free(f->tmp_path);
    f->tmp_path = NULL;
  }
  ds_atomic_abort(f);
  return st;
}

void ds_atomic_abort(ds_atomic_file *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  if (f->tmp_path) unlink(f->tmp_path);
  free(f->tmp_path);
  free(f->final_path);
  f->tmp_path = f->final_path = NULL;
}

ds_status ds_write_file_atomic(const char *path, const void *data, size_t n) {
  ds_atomic_file f;
  DS_TRY(ds_atomic_open(&f, path));
  ds_status st = ds_atomic_write(&f, data, n);
  if (st != DS_OK) { ds_atomic_abort(&f); return st; }
  return ds_atomic_commit(&f);
}

char *ds_path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = ds_malloc(n, "path");
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

int ds_file_exists(const char *path) { struct stat st; return stat(path, &st) == 0; }

ds_status ds_path_probe(const char *path, int *exists) {
  *exists = 0;
  struct stat st;
  if (stat(path, &st) == 0) {
    *exists = 1;
    return DS_OK;
  }
  int err = errno;
  if (err == ENOENT || err == ENOTDIR) {
    /* The name itself may be there as a symlink to nothing: say so rather than "missing". */
    if (err == ENOENT && lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
      char target[512];
      ssize_t n = readlink(path, target, sizeof target - 1);
      target[n > 0 ? n : 0] = 0;
      return DS_FAIL(DS_ERR_IO, "%s: is a symbolic link to '%s', which does not exist (dangling link)", path,
                     target);
    }
    return DS_OK;
  }
  if (err == ELOOP)
    return DS_FAIL(DS_ERR_IO, "%s: cannot be resolved: %s (a symbolic link that points to itself or into a cycle)",
                   path, strerror(err));
  return DS_FAIL(DS_ERR_IO, "%s: cannot be examined: %s", path, strerror(err));
}

ds_status ds_mkdir_p(const char *path) {
  size_t n = strlen(path);
  char *buf = ds_malloc(n + 1, "path");
  if (!buf) return DS_ERR_NOMEM;
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    char c = buf[i];
    buf[i] = 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
      ds_status st = DS_FAIL(DS_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
      free(buf);
      return st;
    }
    buf[i] = c;
  }
  free(buf);
  /* mkdir's EEXIST says only that a name exists: it must resolve to a directory (a symlink
   * loop, a dangling link or a file there is refused with the reason). */
  struct stat st;
  if (stat(path, &st) != 0)
    return DS_FAIL(DS_ERR_IO, "%s: cannot use as a directory: %s", path, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return DS_FAIL(DS_ERR_IO, "%s: cannot use as a directory: %s", path, strerror(ENOTDIR));
  return DS_OK;
}

ds_status ds_dir_lock_acquire(const char *dir, const char *what, ds_dir_lock *out) {
  out->fd = -1;
  char *path = ds_path_join(dir, ".lock");
  if (!path) return DS_ERR_NOMEM;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    ds_status st = DS_FAIL(DS_ERR_IO, "%s: cannot open the %s's lock file: %s", path, what, strerror(errno));
    free(path);
    return st;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    char holder[32] = "";
    ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = 0;
    holder[strcspn(holder, "\n")] = 0;
    close(fd);
    free(path);
    if (err == EWOULDBLOCK)
      return DS_FAIL(DS_ERR_IO, "%s: the %s is in use by another dspark process (pid %s); wait for it to finish, "
                     "or use another directory", dir, what, holder[0] ? holder : "unknown");
    return DS_FAIL(DS_ERR_IO, "%s: cannot lock the %s: %s", dir, what, strerror(err));
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
    ds_status st = DS_FAIL(DS_ERR_IO, "%s: cannot write the %s's lock file: %s", path, what, strerror(errno));
    close(fd);
    free(path);
    return st;
  }
  free(path);
  out->fd = fd;
  return DS_OK;
}

void ds_dir_unlock(ds_dir_lock *l) {
  if (l->fd >= 0) close(l->fd); /* closing releases the flock */
  l->fd = -1;
}

/* "NAME.tmp.DIGITS" */
static int is_temp_name(const char *name) {
  const char *t = strstr(name, ".tmp.");
  if (!t || t == name) return 0;
  const char *p = t + 5;
  if (!*p) return 0;
  for (; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  return 1;
}

int ds_dir_is_empty(const char *path) {
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT;
  int empty = 1;
  for (struct dirent *e; empty && (e = readdir(d)) != NULL;)
    empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
  closedir(d);
  return empty;
}

ds_status ds_remove_stale_temps(const char *dir, int *removed) {
  if (removed) *removed = 0;
  DIR *d = opendir(dir);
  if (!d) return DS_FAIL(DS_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
  ds_status st = DS_OK;
  struct dirent *e;
  while (st == DS_OK && (e = readdir(d)) != NULL) {
    if (!is_temp_name(e->d_name)) continue;
    char *p = ds_path_join(dir, e->d_name);
    if (!p) { st = DS_ERR_NOMEM; break; }
    if (unlink(p) != 0 && errno != ENOENT) st = DS_FAIL(DS_ERR_IO, "%s: cannot remove a stale temp file: %s", p, strerror(errno));
    else if (removed) (*removed)++;
    free(p);
  }
  closedir(d);
  return st;
}
