/* Clocks, shares of calls, strings and files. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "base/share.h"

uint64_t ust__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ust__unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint32_t ust__share_q32(double p) {
  if (!(p > 0))
    return 0;
  const double q = p * 4294967296.0 + 0.5;
  return q >= 4294967295.0 ? UINT32_MAX : (uint32_t)q;
}

int ust__sampled(uint64_t n, uint32_t q32) { return ust__share_hit(n, q32); }

const char *ust_version(void) { return UST_VERSION_STRING; }

void ust_free(void *p) { free(p); }

char *ust__strdup(const char *s) {
  if (s == NULL)
    return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d != NULL)
    memcpy(d, s, n);
  return d;
}

int ust__copy_name(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap)
    return -1;
  memcpy(dst, src, n + 1);
  return 0;
}

char *ust__read_file(const char *path, size_t max, size_t *len_out) {
  /* Non-blocking: a FIFO planted at the path must not hang the caller. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    ust__error(UST_EIO, "'%s' cannot be opened: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  char *buf = NULL;
  if (fstat(fd, &st) != 0) {
    ust__error(UST_EIO, "'%s' cannot be read: %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    ust__error(UST_EIO, "'%s' is not a regular file", path);
    errno = EINVAL;
  } else if ((uint64_t)st.st_size > max) {
    ust__error(UST_EIO, "'%s' is %lld bytes, more than the %zu read at most", path, (long long)st.st_size, max);
    errno = EFBIG;
  } else if ((buf = malloc((size_t)st.st_size + 1)) == NULL) {
    ust__error(UST_ENOMEM, "out of memory reading '%s'", path);
    errno = ENOMEM;
  } else {
    size_t len = 0;
    while (len < (size_t)st.st_size) {
      ssize_t r = read(fd, buf + len, (size_t)st.st_size - len);
      if (r < 0 && errno == EINTR)
        continue;
      if (r <= 0)
        break;
      len += (size_t)r;
    }
    if (len != (size_t)st.st_size) { /* it shrank under us, or failed */
      ust__error(UST_EIO, "'%s' changed while it was read", path);
      free(buf);
      buf = NULL;
      errno = EIO;
    } else {
      buf[len] = '\0';
      if (len_out != NULL)
        *len_out = len;
    }
  }
  const int saved = errno;
  close(fd);
  errno = saved;
  return buf;
}

typedef struct key_seen {
  const char *key;
  UT_hash_handle hh;
} key_seen;

/* What duplicate_key returns when memory ran out before it could tell. */
static const char no_memory[] = "";

/* A key given twice in one object, anywhere in the tree, NULL when none is,
 * or no_memory. Linear: each object's keys go through a hash set. */
static const char *duplicate_key(const cJSON *node) {
  for (; node != NULL; node = node->next) {
    if (cJSON_IsObject(node) && node->child != NULL) {
      int n = cJSON_GetArraySize(node);
      key_seen *seen = NULL, *marks = calloc((size_t)n, sizeof *marks);
      const char *dup = marks == NULL ? no_memory : NULL;
      int i = 0;
      for (const cJSON *it = node->child; it != NULL && dup == NULL; it = it->next, i++) {
        key_seen *found = NULL;
        HASH_FIND_STR(seen, it->string, found);
        if (found != NULL) {
          dup = it->string;
          break;
        }
        marks[i].key = it->string;
        ust__hash_oom = 0;
        HASH_ADD_KEYPTR(hh, seen, marks[i].key, strlen(marks[i].key), &marks[i]);
        if (ust__hash_oom)
          dup = no_memory;
      }
      HASH_CLEAR(hh, seen);
      free(marks);
      if (dup != NULL)
        return dup;
    }
    if ((cJSON_IsObject(node) || cJSON_IsArray(node)) && node->child != NULL) {
      const char *d = duplicate_key(node->child);
      if (d != NULL)
        return d;
    }
  }
  return NULL;
}

cJSON *ust__json_parse(const char *text, const char *what, int kind) {
  /* cJSON decodes \u0000 into a string cut short there: "silu\u0000x" would
   * read as "silu". Such a string is refused before parsing. */
  for (const char *p = text; (p = strchr(p, '\\')) != NULL; p += 2) {
    if (p[1] == '\0')
      break;
    if (p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0)
      return ust__error(kind, "%s: a string holds a NUL character (\\u0000, offset %ld)", what, (long)(p - text)),
             NULL;
  }
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
  if (root == NULL) {
    /* where, never what: the text may be a file the user did not write (a
     * config path that links to a secret), whose bytes must not reach a log */
    long line = 1, column = 1;
    for (const char *p = text; end != NULL && p < end && *p != '\0'; p++) {
      column++;
      if (*p == '\n') {
        line++;
        column = 1;
      }
    }
    if (end != NULL)
      ust__error(kind, "%s: not valid JSON, or more than one value (line %ld, column %ld, offset %ld)", what, line,
                 column, (long)(end - text));
    else
      ust__error(kind, "%s: not valid JSON, or more than one value", what);
    return NULL;
  }
  const char *dup = duplicate_key(root);
  if (dup == no_memory) {
    ust__error(UST_ENOMEM, "%s: out of memory checking its keys", what);
    cJSON_Delete(root);
    return NULL;
  }
  if (dup != NULL) { /* the key is the text's, which is not quoted (above) */
    ust__error(kind, "%s: a key appears twice in one object (which one holds is ambiguous)", what);
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

int ust__write_file_atomic(const char *path, const char *text, const char *what) {
  /* A fresh name beside the target, created exclusively (O_EXCL never
   * follows or reuses what another process planted there). */
  char tmp[4200];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= sizeof tmp)
    return ust__error(UST_EIO, "%s: the path '%s' is too long", what, path);
  int fd = mkstemp(tmp);
  if (fd >= 0)
    fcntl(fd, F_SETFD, FD_CLOEXEC);
  if (fd < 0)
    return ust__error(UST_EIO, "%s: cannot create a temp file beside '%s': %s", what, path, strerror(errno));
  size_t len = strlen(text), off = 0;
  int rc = 0;
  if (fchmod(fd, 0644) != 0)
    rc = ust__error(UST_EIO, "%s: chmod '%s': %s", what, tmp, strerror(errno));
  while (rc == 0 && off < len) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      rc = ust__error(UST_EIO, "%s: writing '%s': %s", what, tmp, strerror(errno));
      break;
    }
    off += (size_t)w;
  }
  if (rc == 0 && fsync(fd) != 0)
    rc = ust__error(UST_EIO, "%s: fsync '%s': %s", what, tmp, strerror(errno));
  close(fd);
  if (rc == 0 && rename(tmp, path) != 0)
    rc = ust__error(UST_EIO, "%s: rename to '%s': %s", what, path, strerror(errno));
  if (rc != 0)
    unlink(tmp);
  return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void free_names(char **names, int n) {
  for (int i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

/* The *.json file names of dir (hidden files left out), sorted. */
static int list_json(const char *dir, const char *what, char ***names_out, int *n_out) {
  *names_out = NULL;
  *n_out = 0;
  DIR *d = opendir(dir);
  if (d == NULL)
    return ust__error(UST_EPROBLEM, "%s directory '%s' cannot be opened", what, dir);
  char **names = NULL;
  int n = 0, cap = 0, rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0 || e->d_name[0] == '.')
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 32;
      char **bigger = realloc(names, (size_t)cap * sizeof *names);
      if (bigger == NULL) {
        rc = ust__error(UST_ENOMEM, "out of memory listing '%s'", dir);
        break;
      }
      names = bigger;
    }
    if ((names[n] = ust__strdup(e->d_name)) == NULL) {
      rc = ust__error(UST_ENOMEM, "out of memory listing '%s'", dir);
      break;
    }
    n++;
  }
  closedir(d);
  if (rc == 0 && n == 0)
    rc = ust__error(UST_EPROBLEM, "%s directory '%s' holds no *.json files", what, dir);
  if (rc != 0) {
    free_names(names, n);
    return rc;
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  *names_out = names;
  *n_out = n;
  return 0;
}

char *ust__read_text_file(const char *path, size_t max) {
  size_t len = 0;
  char *text = ust__read_file(path, max, &len);
  const char *nul = text != NULL ? memchr(text, '\0', len) : NULL;
  if (nul != NULL) {
    ust__error(UST_EIO, "'%s' holds a NUL byte at offset %ld (what follows it would not be read)", path,
               (long)(nul - text));
    free(text);
    errno = EINVAL;
    return NULL;
  }
  return text;
}

int ust__load_json_dir(const char *dir, const char *what, ust__json_file_cb cb, void *ctx) {
  char **names = NULL;
  int n = 0;
  int rc = list_json(dir, what, &names, &n);
  for (int i = 0; rc == 0 && i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    char *text = ust__read_text_file(path, UST__FILE_MAX);
    if (text == NULL) {
      rc = ust__error(UST_EPROBLEM, "%s: %s", what, ust_last_error());
      break;
    }
    rc = cb(path, text, i, n, ctx);
    free(text);
  }
  free_names(names, n);
  return rc;
}

#if defined(UST_GPU_CUDA) || defined(UST_GPU_HIP)
#include "base/gpu_runtime.h"

int ust__gpu_check(ust__log_sink *log, int err, const char *stmt, const char *fn, const char *file, int line) {
  if (err != (int)cudaSuccess) {
    ust__error(UST_EGPU, "GPU call failed: %s: %s (in %s, %s:%d)", stmt, cudaGetErrorString((cudaError_t)err), fn,
               file, line);
    ust__log(log, UST_LOG_WARN, "%s", ust_last_error());
    /* the runtime keeps a failed call's error for the thread's next
     * cudaGetLastError: torch checks it after its own launches, and would
     * raise ours in the caller */
    (void)cudaGetLastError();
  }
  return err;
}
#endif
