/*
 * Loading candidate shared objects only when they are the bytes that were
 * pinned: a SHA-256 of the file, checked and loaded from one in-memory copy.
 *
 * Threading: both functions may be called from any thread at any time; they
 * keep no state between calls. Errors go to the calling thread's last error
 * (ust_last_error()). Nothing here aborts or exits.
 *
 * Internal header: never installed.
 */
#ifndef UST_VERIFY_H
#define UST_VERIFY_H

#include <stddef.h>

/* A candidate shared object is read whole before it is hashed: at most this
 * many bytes, from a regular file. */
#define UST__CANDIDATE_MAX (1u << 30)

/* SHA-256 (FIPS 180-4) of len bytes as 64 lowercase hex digits + NUL into hex.
 * data is borrowed for the call and may be NULL when len is 0; hex is the
 * caller's storage of at least 65 bytes. Cannot fail. */
void ust__sha256_hex(const void *data, size_t len, char hex[65]);

/* A pin as 64 lowercase hex digits + NUL into out; -1 (out undefined) when
 * pin is not 64 hex digits, in either case. */
int ust__sha256_pin_parse(const char *pin, char out[65]);

/* Load the shared object at path only if its SHA-256 equals pin (64 hex
 * digits, either case).
 *
 * The file is read once into memory, hashed, and exactly those bytes are
 * loaded (written to a sealed memfd_create'd file and dlopen'ed through
 * /proc/self/fd/N, RTLD_NOW|RTLD_LOCAL), so the file cannot be swapped
 * between the check and the load.
 *
 * path and pin are borrowed for the call. On success returns 0 and stores a
 * new handle in *handle and the memfd in *fd_out: the object is named
 * /proc/self/fd/N after that descriptor, so the caller keeps it open while
 * the object is loaded and closes it after dlclose().
 * On failure *handle is left untouched and one of these is returned, with
 * ust_last_error() set:
 *   UST_EINVAL    path or handle is NULL.
 *   UST_ECONFIG   pin is not 64 hex digits, or the digest differs (the
 *                 message names the path, the pinned digest and the actual
 *                 digest).
 *   UST_EIO       the file cannot be read (the message names the path and
 *                 strerror), or the in-memory copy cannot be made.
 *   UST_EINTERNAL dlopen fails (the message names the path and dlerror()).
 *
 * Loading runs the object's constructors on the calling thread. */
int ust__dlopen_verified(const char *path, const char *pin, void **handle, int *fd_out);

/* A dependency pinned in the config (candidate.deps): borrowed strings. */
typedef struct ust__dep_pin {
  const char *path;
  const char *sha256;
} ust__dep_pin;

#define UST__MAX_DEPS 16

/* Dependencies loaded for an object, in load order: close each fd after
 * dlclose of its handle, the object first, then these in reverse. */
typedef struct ust__loaded_deps {
  int n;
  char path[UST__MAX_DEPS][512];
  void *dl[UST__MAX_DEPS];
  int fd[UST__MAX_DEPS];
} ust__loaded_deps;

/* ust__dlopen_verified, with the object's closure pinned: every shared
 * object it needs (DT_NEEDED, recursively) must be a system library (the
 * loader resolves it from the system's trusted directories: /lib, /usr/lib,
 * /lib64, /usr/lib64 and their multiarch folders), one the process has
 * loaded already (the loader reuses it), or pinned in deps, matched by its
 * file name; pinned ones are verified the same way and loaded first, from
 * their checked bytes (RTLD_GLOBAL, so that the object finds them by their
 * soname). Anything else is refused (UST_ECONFIG) naming the library and
 * where the loader would take it from, before any constructor runs. */
int ust__dlopen_verified_closure(const char *path, const char *pin, const ust__dep_pin *deps, int n_deps,
                                 ust__loaded_deps *loaded, void **handle, int *fd_out);

#endif /* UST_VERIFY_H */
