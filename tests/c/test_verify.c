/* SHA-256 against published and hashlib-computed digests; loading shared
 * objects only when their bytes match the pinned digest. The expected digests
 * here come from FIPS 180-4 and Python's hashlib, never from the code under
 * test. */
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

#include "plugin/plugin.h"
#include "plugin/verify.h"
#include "tests/c/runner.h"

/* Descriptors kept by successful loads in the single-load tests. */
static int kept_fd = -1;

#define CJSON_SO "/usr/lib/x86_64-linux-gnu/libcjson.so.1"
#define ZLIB_SO "/usr/lib/x86_64-linux-gnu/libz.so.1"

/* Write n bytes to a new temp file; path must be a "...XXXXXX" template. */
static void write_temp(char *path, const void *data, size_t n) {
  int fd = mkstemp(path);
  ASSERT_TRUE(fd >= 0);
  ASSERT_INT_EQ(write(fd, data, n), (long long)n);
  ASSERT_INT_EQ(close(fd), 0);
}

/* The digest of a file's bytes, or 0 when it is absent (the test then skips). */
static int file_digest(const char *path, char hex[65]) {
  if (access(path, R_OK) != 0)
    return 0;
  size_t len = 0;
  char *bytes = ust__read_file(path, UST__FILE_MAX << 6, &len);
  ASSERT_TRUE(bytes != NULL);
  ust__sha256_hex(bytes, len, hex);
  free(bytes);
  return 1;
}

TEST(sha256_known_vectors) {
  char hex[65];
  ust__sha256_hex(NULL, 0, hex);
  ASSERT_STR_EQ(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  ust__sha256_hex("abc", 3, hex);
  ASSERT_STR_EQ(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  ust__sha256_hex(m448, strlen(m448), hex);
  ASSERT_STR_EQ(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  char *million = malloc(1000000);
  ASSERT_TRUE(million != NULL);
  memset(million, 'a', 1000000);
  ust__sha256_hex(million, 1000000, hex);
  free(million);
  ASSERT_STR_EQ(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");

  /* Every length 0..200 crosses each padding case (one or two final blocks,
   * the 55/56 and 63/64 edges). The expected value is, from Python:
   *   pat = bytes((i * 167 + 13) & 0xff for i in range(200))
   *   cat = "".join(hashlib.sha256(pat[:n]).hexdigest() for n in range(201))
   *   hashlib.sha256(cat.encode()).hexdigest() */
  unsigned char pat[200];
  for (int i = 0; i < 200; i++)
    pat[i] = (unsigned char)((i * 167 + 13) & 0xff);
  char *cat = malloc(201 * 64 + 1);
  ASSERT_TRUE(cat != NULL);
  for (int n = 0; n <= 200; n++)
    ust__sha256_hex(pat, (size_t)n, cat + 64 * n);
  ust__sha256_hex(cat, 201 * 64, hex);
  free(cat);
  ASSERT_STR_EQ(hex, "e7b239674ad544550c90f62f8854a25efb963cda921c9c7c65a0f5b646da8b7e");
}

TEST(dlopen_verified_refuses_mismatch) {
  char path[] = "/tmp/ust-verify-XXXXXX";
  write_temp(path, "hello", 5);
  void *h = (void *)&h;
  const char *wrong = "0000000000000000000000000000000000000000000000000000000000000000";
  ASSERT_INT_EQ(ust__dlopen_verified(path, wrong, &h, &kept_fd), UST_ECONFIG);
  ASSERT_STR_CONTAINS(ust_last_error(), path);
  ASSERT_STR_CONTAINS(ust_last_error(), wrong);
  ASSERT_STR_CONTAINS(ust_last_error(), "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
  ASSERT_TRUE(h == (void *)&h);

  const char *malformed[] = {
      NULL,
      "",
      "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b982",
      "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b98240",
      "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b982g",
      " 2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b982",
      "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
  };
  for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
    ASSERT_INT_EQ(ust__dlopen_verified(path, malformed[i], &h, &kept_fd), UST_ECONFIG);
    ASSERT_STR_CONTAINS(ust_last_error(), "is not 64 hex digits");
    ASSERT_STR_CONTAINS(ust_last_error(), path);
  }
  ASSERT_INT_EQ(unlink(path), 0);

  const char *pin = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
  ASSERT_INT_EQ(ust__dlopen_verified(path, pin, &h, &kept_fd), UST_EIO);
  ASSERT_STR_CONTAINS(ust_last_error(), path);
  ASSERT_STR_CONTAINS(ust_last_error(), strerror(ENOENT));
  ASSERT_INT_EQ(ust__dlopen_verified("/tmp", pin, &h, &kept_fd), UST_EIO);
  ASSERT_STR_CONTAINS(ust_last_error(), "'/tmp' is not a regular file");
  ASSERT_INT_EQ(ust__dlopen_verified(NULL, pin, &h, &kept_fd), UST_EINVAL);
  ASSERT_INT_EQ(ust__dlopen_verified(path, pin, NULL, &kept_fd), UST_EINVAL);
  ASSERT_TRUE(h == (void *)&h);
}

TEST(dlopen_verified_loads_pinned) {
  char pin[65];
  if (!file_digest(CJSON_SO, pin)) {
    fprintf(stderr, "skipped: %s is absent\n", CJSON_SO);
    return;
  }
  void *h = NULL;
  ASSERT_INT_EQ(ust__dlopen_verified(CJSON_SO, pin, &h, &kept_fd), 0);
  ASSERT_TRUE(h != NULL);
  const char *(*version)(void);
  *(void **)&version = dlsym(h, "cJSON_Version");
  ASSERT_TRUE(version != NULL);
  ASSERT_STR_CONTAINS(version(), ".");
  ASSERT_INT_EQ(dlclose(h), 0);
  close(kept_fd);

  /* A digest that matches bytes which are not an ELF object gets past the
   * pin (in upper case too) and fails in dlopen. */
  char path[] = "/tmp/ust-verify-XXXXXX";
  write_temp(path, "not an ELF object\n", 18);
  h = NULL;
  ASSERT_INT_EQ(ust__dlopen_verified(path, "FD679D38D79ED3776E37B06764ADF01E9C2D872FC9A41448E86B086FFBBE5029", &h, &kept_fd),
                UST_EINTERNAL);
  ASSERT_STR_CONTAINS(ust_last_error(), path);
  ASSERT_STR_CONTAINS(ust_last_error(), "dlopen failed");
  ASSERT_TRUE(h == NULL);
  ASSERT_INT_EQ(unlink(path), 0);
}

/* Each load goes through a fresh memfd whose descriptor number is usually
 * the one the previous load used and closed; the second object must still be
 * the second file, not the first one found again by its /proc/self/fd name. */
TEST(dlopen_verified_loads_each_file) {
  char cjson_pin[65], zlib_pin[65];
  if (!file_digest(CJSON_SO, cjson_pin) || !file_digest(ZLIB_SO, zlib_pin)) {
    fprintf(stderr, "skipped: %s or %s is absent\n", CJSON_SO, ZLIB_SO);
    return;
  }
  void *a = NULL, *b = NULL, *c = NULL;
  int fds[3] = {-1, -1, -1};
  ASSERT_INT_EQ(ust__dlopen_verified(CJSON_SO, cjson_pin, &a, &fds[0]), 0);
  ASSERT_INT_EQ(ust__dlopen_verified(ZLIB_SO, zlib_pin, &b, &fds[1]), 0);
  ASSERT_TRUE(a != b);
  ASSERT_TRUE(dlsym(b, "zlibVersion") != NULL);
  ASSERT_TRUE(dlsym(b, "cJSON_Version") == NULL);
  ASSERT_TRUE(dlsym(a, "cJSON_Version") != NULL);
  /* A third load steps over both names still in use. */
  ASSERT_INT_EQ(ust__dlopen_verified(CJSON_SO, cjson_pin, &c, &fds[2]), 0);
  ASSERT_TRUE(c != a && c != b);
  ASSERT_TRUE(dlsym(c, "cJSON_Version") != NULL);
  ASSERT_INT_EQ(dlclose(c), 0);
  ASSERT_INT_EQ(dlclose(b), 0);
  ASSERT_INT_EQ(dlclose(a), 0);
  /* Each load kept its own descriptor, so each name still named its bytes. */
  ASSERT_TRUE(fds[0] != fds[1] && fds[1] != fds[2] && fds[0] != fds[2]);
  for (int i = 0; i < 3; i++)
    close(fds[i]);
}
