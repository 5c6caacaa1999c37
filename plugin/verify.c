/* SHA-256 (FIPS 180-4) and loading shared objects whose bytes match a pin. */

/* memfd_create, the memfd seals and RTLD_NOLOAD are GNU extensions that the
 * build's _POSIX_C_SOURCE/_DEFAULT_SOURCE do not expose. */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int ust__dlopen_verified(const char *path, const char *pin, void **handle, int *fd_out) {
  if (path == NULL || handle == NULL || fd_out == NULL)
    return ust__error(UST_EINVAL, "ust__dlopen_verified: path, handle and fd_out must not be NULL");
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
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
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
