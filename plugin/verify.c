/* SHA-256 (FIPS 180-4) and loading shared objects whose bytes match a pin. */

/* memfd_create, the memfd seals and RTLD_NOLOAD are GNU extensions that the
 * build's _POSIX_C_SOURCE/_DEFAULT_SOURCE do not expose. */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plugin/plugin.h"
#include "plugin/verify.h"

/* ---- SHA-256 ------------------------------------------------------------ */

/* First 32 bits of the fractional parts of the square roots of the first 8
 * primes (FIPS 180-4, 5.3.3). */
static const uint32_t sha256_h0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

/* First 32 bits of the fractional parts of the cube roots of the first 64
 * primes (FIPS 180-4, 4.2.2). */
static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr32(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block into the state (FIPS 180-4, 6.2.2). */
static void sha256_block(uint32_t h[8], const unsigned char *p) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 |
           (uint32_t)p[4 * t + 3];
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = rotr32(w[t - 15], 7) ^ rotr32(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr32(w[t - 2], 17) ^ rotr32(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t s1 = rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = hh + s1 + ch + sha256_k[t] + w[t];
    uint32_t s0 = rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

void ust__sha256_hex(const void *data, size_t len, char hex[65]) {
  const unsigned char *p = data;
  uint32_t h[8];
  memcpy(h, sha256_h0, sizeof h);
  size_t full = len / 64, rest = len % 64;
  for (size_t i = 0; i < full; i++)
    sha256_block(h, p + 64 * i);

  /* The padding (0x80, zeros, 64-bit big-endian bit length) spills into a
   * second block when fewer than 9 bytes are left in the last one. */
  unsigned char tail[128] = {0};
  if (rest > 0)
    memcpy(tail, p + 64 * full, rest);
  tail[rest] = 0x80;
  size_t tail_len = rest < 56 ? 64 : 128;
  uint64_t bits = (uint64_t)len * 8;
  for (int i = 0; i < 8; i++)
    tail[tail_len - 1 - (size_t)i] = (unsigned char)(bits >> (8 * i));
  sha256_block(h, tail);
  if (tail_len == 128)
    sha256_block(h, tail + 64);

  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++)
      hex[8 * i + j] = digits[(h[i] >> (28 - 4 * j)) & 0xf];
  hex[64] = '\0';
}

/* ---- verified loading ---------------------------------------------------- */

/* How many other descriptor numbers to try when /proc/self/fd/N names an
 * object that is still loaded; each try steps over one such object. */
#define UST__VERIFY_MAX_RENAMES 64

static int normalise_pin(const char *pin, char out[65]);

int ust__sha256_pin_parse(const char *pin, char out[65]) {
  return normalise_pin(pin, out) ? 0 : -1;
}

/* Copy pin into out as 64 lowercase hex digits; 0 when it is not 64 hex digits. */
static int normalise_pin(const char *pin, char out[65]) {
  if (pin == NULL)
    return 0;
  for (int i = 0; i < 64; i++) {
    char c = pin[i];
    if (c >= '0' && c <= '9')
      out[i] = c;
    else if (c >= 'a' && c <= 'f')
      out[i] = c;
    else if (c >= 'A' && c <= 'F')
      out[i] = (char)(c - 'A' + 'a');
    else
      return 0; /* also stops at a NUL before 64 digits */
  }
  out[64] = '\0';
  return pin[64] == '\0';
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int pread_all(int fd, char *p, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, p + done, n - done, (off_t)done);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (r == 0) {
      errno = EIO;
      return -1;
    }
    done += (size_t)r;
  }
  return 0;
}

/* Put the len bytes into a new sealed memfd (stored in *fd_out, also on
 * failure, so the caller closes it), then hash what the memfd holds once it
 * can no longer change and compare it with want. Between the write and the
 * seal another process of the same user could write to the memfd through
 * /proc; the second hash closes that window. bytes is reused as the buffer. */
static int copy_sealed(const char *path, const char *pin, const char *want, char *bytes, size_t len,
                       int *fd_out) {
  int fd = memfd_create("ust-verified", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  *fd_out = fd;
  if (fd < 0)
    return ust__error(UST_EIO, "%s: memfd_create failed: %s", path, strerror(errno));
  if (write_all(fd, bytes, len) != 0)
    return ust__error(UST_EIO, "%s: copying into a memfd failed: %s", path, strerror(errno));
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    return ust__error(UST_EIO, "%s: sealing the memfd failed: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0)
    return ust__error(UST_EIO, "%s: fstat of the memfd failed: %s", path, strerror(errno));
  if ((uint64_t)st.st_size != (uint64_t)len)
    return ust__error(UST_ECONFIG, "%s: the in-memory copy has %lld bytes, not %zu", path,
                      (long long)st.st_size, len);
  if (pread_all(fd, bytes, len) != 0)
    return ust__error(UST_EIO, "%s: reading back the memfd failed: %s", path, strerror(errno));
  char got[65];
  ust__sha256_hex(bytes, len, got);
  if (strcmp(got, want) != 0)
    return ust__error(UST_ECONFIG, "%s: the in-memory copy changed: SHA-256 is %s, but the pin is %s",
                      path, got, pin);
  return 0;
}

static int load_pinned(const char *path, const char *pin, const char *as_needed, int flags, const ust__dep_pin *deps,
                       int n_deps, ust__loaded_deps *loaded, int depth, void **handle, int *fd_out);

int ust__dlopen_verified(const char *path, const char *pin, void **handle, int *fd_out) {
  return ust__dlopen_verified_closure(path, pin, NULL, -1, NULL, handle, fd_out);
}

int ust__dlopen_verified_closure(const char *path, const char *pin, const ust__dep_pin *deps, int n_deps,
                                 ust__loaded_deps *loaded, void **handle, int *fd_out) {
  if (path == NULL || handle == NULL || fd_out == NULL)
    return ust__error(UST_EINVAL, "ust__dlopen_verified: path, handle and fd_out must not be NULL");
  return load_pinned(path, pin, NULL, RTLD_NOW | RTLD_LOCAL, deps, n_deps, loaded, 0, handle, fd_out);
}

/* ---- what a shared object needs -------------------------------------------------- */

#define MAX_NEEDED 64

typedef struct elf_needs {
  int n;
  char name[MAX_NEEDED][256]; /* DT_NEEDED */
  char soname[256];           /* DT_SONAME: the name the loader knows it by once loaded ("" none) */
  char rpath[1024];           /* DT_RPATH, searched when there is no DT_RUNPATH */
  char runpath[1024];         /* DT_RUNPATH */
} elf_needs;

/* The file offset of virtual address va in a 64-bit ELF's loaded segments,
 * or -1. */
static int64_t va_to_off(const unsigned char *b, size_t len, const Elf64_Ehdr *eh, uint64_t va) {
  for (int i = 0; i < eh->e_phnum; i++) {
    Elf64_Phdr ph;
    const uint64_t at = eh->e_phoff + (uint64_t)i * eh->e_phentsize;
    if (at + sizeof ph > len)
      return -1;
    memcpy(&ph, b + at, sizeof ph);
    if (ph.p_type == PT_LOAD && va >= ph.p_vaddr && va < ph.p_vaddr + ph.p_filesz)
      return (int64_t)(ph.p_offset + (va - ph.p_vaddr));
  }
  return -1;
}

/* The dynamic section of an ELF64 little-endian shared object held in b: its
 * needs. Every offset is bounds-checked (the bytes are untrusted). */
static int elf_read_needs(const unsigned char *b, size_t len, const char *path, elf_needs *out) {
  memset(out, 0, sizeof *out);
  Elf64_Ehdr eh;
  if (len < sizeof eh || memcmp(b, ELFMAG, SELFMAG) != 0)
    return ust__error(UST_ECONFIG, "%s: not an ELF shared object", path);
  memcpy(&eh, b, sizeof eh);
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_phentsize != sizeof(Elf64_Phdr))
    return ust__error(UST_ECONFIG, "%s: not a 64-bit little-endian ELF object", path);
  uint64_t dyn_off = 0, dyn_size = 0;
  for (int i = 0; i < eh.e_phnum; i++) {
    Elf64_Phdr ph;
    const uint64_t at = eh.e_phoff + (uint64_t)i * eh.e_phentsize;
    if (at + sizeof ph > len)
      return ust__error(UST_ECONFIG, "%s: its program headers run past the file", path);
    memcpy(&ph, b + at, sizeof ph);
    if (ph.p_type == PT_DYNAMIC) {
      dyn_off = ph.p_offset;
      dyn_size = ph.p_filesz;
    }
  }
  if (dyn_size == 0)
    return 0; /* static: needs nothing */
  if (dyn_off > len || dyn_size > len - dyn_off)
    return ust__error(UST_ECONFIG, "%s: its dynamic section runs past the file", path);
  uint64_t strtab_va = 0, strsz = 0, needed[MAX_NEEDED];
  int64_t rpath = -1, runpath = -1, soname = -1;
  int n = 0;
  for (uint64_t at = dyn_off; at + sizeof(Elf64_Dyn) <= dyn_off + dyn_size; at += sizeof(Elf64_Dyn)) {
    Elf64_Dyn d;
    memcpy(&d, b + at, sizeof d);
    if (d.d_tag == DT_NULL)
      break;
    if (d.d_tag == DT_STRTAB)
      strtab_va = d.d_un.d_ptr;
    else if (d.d_tag == DT_STRSZ)
      strsz = d.d_un.d_val;
    else if (d.d_tag == DT_RPATH)
      rpath = (int64_t)d.d_un.d_val;
    else if (d.d_tag == DT_RUNPATH)
      runpath = (int64_t)d.d_un.d_val;
    else if (d.d_tag == DT_SONAME)
      soname = (int64_t)d.d_un.d_val;
    else if (d.d_tag == DT_NEEDED) {
      if (n == MAX_NEEDED)
        return ust__error(UST_ECONFIG, "%s: needs more than %d shared objects", path, MAX_NEEDED);
      needed[n++] = d.d_un.d_val;
    }
  }
  const int64_t strtab = va_to_off(b, len, &eh, strtab_va);
  if ((n > 0 || rpath >= 0 || runpath >= 0 || soname >= 0) &&
      (strtab < 0 || (uint64_t)strtab > len || strsz > len - (uint64_t)strtab))
    return ust__error(UST_ECONFIG, "%s: its string table is not in the file", path);
  const char *st = (const char *)b + strtab;
#define STR(off, dst)                                                                                      \
  do {                                                                                                     \
    if ((uint64_t)(off) >= strsz || memchr(st + (off), '\0', strsz - (uint64_t)(off)) == NULL ||           \
        strlen(st + (off)) >= sizeof(dst))                                                                 \
      return ust__error(UST_ECONFIG, "%s: a name of its dynamic section is not in its string table", path); \
    memcpy((dst), st + (off), strlen(st + (off)) + 1);                                                     \
  } while (0)
  for (int i = 0; i < n; i++)
    STR(needed[i], out->name[i]);
  out->n = n;
  if (rpath >= 0)
    STR(rpath, out->rpath);
  if (runpath >= 0)
    STR(runpath, out->runpath);
  if (soname >= 0)
    STR(soname, out->soname);
#undef STR
  return 0;
}

/* The directories glibc's loader trusts: the system's own. A library found
 * there needs no pin. */
static int in_trusted_dir(const char *file) {
  static const char *const dirs[] = {"/lib/", "/usr/lib/", "/lib64/", "/usr/lib64/", "/lib/x86_64-linux-gnu/",
                                     "/usr/lib/x86_64-linux-gnu/", "/lib/aarch64-linux-gnu/",
                                     "/usr/lib/aarch64-linux-gnu/", NULL};
  char real[PATH_MAX];
  if (realpath(file, real) == NULL)
    return 0;
  const char *slash = strrchr(real, '/');
  for (const char *const *d = dirs; *d != NULL; d++)
    if (strncmp(real, *d, strlen(*d)) == 0 && (size_t)(slash - real) + 1 == strlen(*d))
      return 1;
  return 0;
}

/* LD_LIBRARY_PATH as the loader holds it: the value the process started
 * with (ld.so reads it once, at start-up, the last one set winning; a host
 * that changes or clears os.environ later changes what getenv says, not
 * where dlopen searches), and none in a set-user-ID process, whose loader
 * ignores it. Read from the start-up environment block (/proc/self/environ):
 * 0 with *out a new string ("" when it was not set; free with free), or an
 * error when that block cannot be read. */
#define STARTUP_ENV_MAX (16u << 20)
static int startup_library_path(char **out) {
  *out = NULL;
  if (getauxval(AT_SECURE) != 0)
    return (*out = strdup("")) != NULL ? 0 : ust__error(UST_ENOMEM, "out of memory");
  const int fd = open("/proc/self/environ", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ust__error(UST_EIO, "cannot read the process's start-up environment (/proc/self/environ), where the "
                      "loader's LD_LIBRARY_PATH comes from: %s", strerror(errno));
  size_t len = 0, cap = 0;
  char *block = NULL;
  int rc = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      char *more = cap + 65536 <= STARTUP_ENV_MAX ? realloc(block, cap + 65536) : NULL;
      if (more == NULL) {
        rc = cap + 65536 > STARTUP_ENV_MAX
                 ? ust__error(UST_EIO, "the process's start-up environment is over %u MiB", STARTUP_ENV_MAX >> 20)
                 : ust__error(UST_ENOMEM, "out of memory");
        break;
      }
      block = more;
      cap += 65536;
    }
    const ssize_t k = read(fd, block + len, 4096);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      rc = ust__error(UST_EIO, "reading the process's start-up environment (/proc/self/environ): %s", strerror(errno));
    if (k <= 0)
      break;
    len += (size_t)k;
  }
  close(fd);
  if (rc != 0) {
    free(block);
    return rc;
  }
  static const char key[] = "LD_LIBRARY_PATH=";
  const char *value = "";
  block[len] = '\0';
  for (size_t at = 0; at < len; at += strlen(block + at) + 1)
    if (strncmp(block + at, key, sizeof key - 1) == 0)
      value = block + at + sizeof key - 1;
  *out = strdup(value);
  free(block);
  return *out != NULL ? 0 : ust__error(UST_ENOMEM, "out of memory");
}

/* Where the loader would take name from, searching (as ld.so does) the
 * object's DT_RPATH (without DT_RUNPATH), LD_LIBRARY_PATH (libpath: the
 * loader's, startup_library_path), its DT_RUNPATH ($ORIGIN: the object's
 * directory), then the trusted directories. Into found: 0 not found, 1 from
 * a search path, 2 from a trusted directory. */
static int resolve_needed(const char *name, const elf_needs *nd, const char *origin, const char *libpath, char *out,
                          size_t cap) {
  const char *lists[3] = {nd->runpath[0] == '\0' ? nd->rpath : "", libpath, nd->runpath};
  for (int l = 0; l < 3; l++) {
    const char *list = lists[l] != NULL ? lists[l] : "";
    while (*list != '\0') {
      const char *end = strpbrk(list, ":;"); /* the loader splits its lists at both */
      const size_t n = end != NULL ? (size_t)(end - list) : strlen(list);
      char dir[2 * PATH_MAX];
      if (n > 0 && n < sizeof dir) {
        if (strncmp(list, "$ORIGIN", 7) == 0)
          snprintf(dir, sizeof dir, "%s%.*s", origin, (int)(n - 7), list + 7);
        else
          snprintf(dir, sizeof dir, "%.*s", (int)n, list);
        if ((size_t)snprintf(out, cap, "%s/%s", dir, name) < cap && access(out, F_OK) == 0)
          return in_trusted_dir(out) ? 2 : 1;
      }
      list += n + (end != NULL);
    }
  }
  static const char *const dirs[] = {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
                                     "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib", "/usr/lib",
                                     NULL};
  for (const char *const *d = dirs; *d != NULL; d++) {
    snprintf(out, cap, "%s/%s", *d, name);
    if (access(out, F_OK) == 0)
      return in_trusted_dir(out) ? 2 : 1;
  }
  out[0] = '\0';
  return 0;
}

/* Check what the object (bytes, from path) needs, recursively, and load the
 * pinned dependencies first. deps NULL with n_deps < 0: no closure check (the
 * object alone is pinned: a test of the loader). */
static int check_needs(const char *path, const unsigned char *bytes, size_t len, const char *as_needed,
                       const ust__dep_pin *deps, int n_deps, ust__loaded_deps *loaded, int depth) {
  if (n_deps < 0)
    return 0;
  if (depth > 8)
    return ust__error(UST_ECONFIG, "%s: its dependencies nest more than 8 deep", path);
  elf_needs nd;
  int rc = elf_read_needs(bytes, len, path, &nd);
  if (rc != 0)
    return rc;
  /* A pinned dependency is loaded from its checked bytes first; the loader
   * then satisfies the need from it only if it knows it by the needed name,
   * its DT_SONAME: else it would search the disk for that name and load
   * whatever file is there. */
  if (as_needed != NULL && strcmp(nd.soname, as_needed) != 0)
    return ust__error(UST_ECONFIG, "%s: pinned as the dependency %s, but its DT_SONAME is %s%s%s: the loader would "
                      "not take the pinned bytes for %s and would search the disk for it (link it with "
                      "-Wl,-soname,%s)", path, as_needed, nd.soname[0] ? "'" : "", nd.soname[0] ? nd.soname : "missing",
                      nd.soname[0] ? "'" : "", as_needed, as_needed);
  char origin[PATH_MAX];
  snprintf(origin, sizeof origin, "%s", path);
  char *slash = strrchr(origin, '/');
  if (slash != NULL)
    *slash = '\0';
  else
    snprintf(origin, sizeof origin, ".");
  for (int i = 0; i < nd.n; i++) {
    const char *name = nd.name[i];
    const ust__dep_pin *pin = NULL;
    for (int k = 0; k < n_deps && pin == NULL; k++) {
      const char *base = strrchr(deps[k].path, '/');
      if (strcmp(base != NULL ? base + 1 : deps[k].path, name) == 0)
        pin = &deps[k];
    }
    if (pin != NULL) { /* pinned: verified and loaded before the object, from its checked bytes */
      int done = 0;
      for (int k = 0; k < loaded->n && !done; k++)
        done = strcmp(loaded->path[k], pin->path) == 0;
      if (done)
        continue;
      if (loaded->n == UST__MAX_DEPS)
        return ust__error(UST_ECONFIG, "%s: more than %d pinned dependencies", path, UST__MAX_DEPS);
      void *h = NULL;
      int fd = -1;
      if ((rc = load_pinned(pin->path, pin->sha256, name, RTLD_NOW | RTLD_GLOBAL, deps, n_deps, loaded, depth + 1, &h,
                            &fd)) != 0)
        return ust__error(rc, "%s: its dependency %s: %s", path, name, ust_last_error());
      snprintf(loaded->path[loaded->n], sizeof loaded->path[loaded->n], "%s", pin->path);
      loaded->dl[loaded->n] = h;
      loaded->fd[loaded->n++] = fd;
      continue;
    }
    void *already = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (already != NULL) { /* the host loaded it already: the loader reuses that one */
      dlclose(already);
      continue;
    }
    char where[PATH_MAX + 300];
    char *libpath = NULL;
    if (strchr(name, '/') == NULL && (rc = startup_library_path(&libpath)) != 0)
      return ust__error(rc, "%s: finding its dependency %s: %s", path, name, ust_last_error());
    const int found = strchr(name, '/') != NULL ? (snprintf(where, sizeof where, "%s", name), in_trusted_dir(name) ? 2 : 1)
                                                : resolve_needed(name, &nd, origin, libpath, where, sizeof where);
    free(libpath);
    if (found == 2)
      continue; /* a system library */
    if (found == 1)
      return ust__error(UST_ECONFIG, "%s: it needs %s, which the loader would take from %s, outside the system's "
                        "trusted directories; pin it in candidate.deps {\"%s\": \"<sha256>\"}", path, name, where,
                        where);
    return ust__error(UST_ECONFIG, "%s: it needs %s, which is neither a system library nor loaded nor pinned in "
                      "candidate.deps", path, name);
  }
  return 0;
}

static int load_pinned(const char *path, const char *pin, const char *as_needed, int flags, const ust__dep_pin *deps,
                       int n_deps, ust__loaded_deps *loaded, int depth, void **handle, int *fd_out) {
  char want[65];
  if (!normalise_pin(pin, want))
    return ust__error(UST_ECONFIG, "%s: pin '%.80s' is not 64 hex digits", path,
                      pin != NULL ? pin : "(null)");

  size_t len = 0;
  char *bytes = ust__read_file(path, UST__CANDIDATE_MAX, &len);
  if (bytes == NULL)
    return UST_EIO; /* the message names the path and why */

  int rc = 0, fd = -1, n_extra = 0, keep_fd = -1;
  int extra[UST__VERIFY_MAX_RENAMES];
  char got[65];
  ust__sha256_hex(bytes, len, got);
  if (strcmp(got, want) != 0) {
    rc = ust__error(UST_ECONFIG, "%s: SHA-256 is %s, but the pin is %s", path, got, pin);
    goto out;
  }
  /* what it needs is checked (and pinned dependencies loaded) before its
   * own constructors can run */
  if ((rc = check_needs(path, (const unsigned char *)bytes, len, as_needed, deps, n_deps, loaded, depth)) != 0)
    goto out;
  rc = copy_sealed(path, pin, want, bytes, len, &fd);
  if (rc != 0)
    goto out;

  /* glibc finds already-loaded objects by the name given to dlopen, and an
   * object loaded through a descriptor that has since been closed keeps the
   * name /proc/self/fd/N. Loading through a reused N would silently hand back
   * that earlier object, so step to another descriptor number while the name
   * is taken. No new object can take our name while we hold the descriptor. */
  int load_fd = fd;
  char name[40];
  for (;;) {
    snprintf(name, sizeof name, "/proc/self/fd/%d", load_fd);
    void *taken = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (taken == NULL)
      break;
    dlclose(taken);
    if (n_extra == UST__VERIFY_MAX_RENAMES) {
      rc = ust__error(UST_EINTERNAL, "%s: dlopen failed: %d loaded objects hold the names /proc/self/fd/N",
                      path, UST__VERIFY_MAX_RENAMES);
      goto out;
    }
    load_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (load_fd < 0) {
      rc = ust__error(UST_EIO, "%s: duplicating the memfd failed: %s", path, strerror(errno));
      goto out;
    }
    extra[n_extra++] = load_fd;
  }

  dlerror();
  void *h = dlopen(name, flags);
  if (h == NULL) {
    const char *why = dlerror();
    rc = ust__error(UST_EINTERNAL, "%s: dlopen failed: %s", path, why != NULL ? why : "unknown error");
    goto out;
  }
  *handle = h;
  /* The object's name stays /proc/self/fd/N: that descriptor stays open for
   * as long as the object is loaded, so the name keeps naming these bytes
   * (runtimes and debuggers that reopen a loaded object by its name, as the
   * CUDA runtime does, read what was verified). */
  keep_fd = load_fd;
  *fd_out = keep_fd;

out:
  for (int i = 0; i < n_extra; i++)
    if (extra[i] != keep_fd)
      close(extra[i]);
  if (fd >= 0 && fd != keep_fd)
    close(fd);
  free(bytes);
  return rc;
}
