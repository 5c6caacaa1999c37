// An LD_PRELOAD library for out-of-memory sweeps of the torch seam
// (tests/python/test_hostile.py): once armed, the n-th allocation that
// libunderstudy.so's own code makes on the arming thread (not its worker's,
// whose timing would make a sweep uneven) fails as on an exhausted heap: operator
// new throws std::bad_alloc, malloc, calloc, realloc, aligned_alloc and
// posix_memalign return ENOMEM. Every other allocation is glibc's. A library
// whose toolchain linked the C++ runtime into it (its own operator new) is
// swept through that operator new's malloc.
//
//   fail_new_arm(n)      fail the allocation after the next n from the
//                        library (n < 0: disarm); -1 when no libunderstudy.so
//                        is mapped
//   fail_new_seen()      allocations from the library since the last arm
//   fail_new_failed()    allocations failed since the process started
//   fail_new_failed_at() the last failed one's return address, as an offset
//                        into libunderstudy.so (addr2line -f -e it)
//   fail_new_through()   allocations of the process that came here (0: the
//                        library was not preloaded)
#include <errno.h>
#include <link.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

extern "C" {
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t align, size_t n);
}

namespace {

std::atomic<long> g_countdown{-1}; // allocations to let through before failing one; -1: disarmed
std::atomic<long> g_seen{0};
std::atomic<long> g_failed{0};
std::atomic<uintptr_t> g_failed_at{0}; // the library's offset of the last failed allocation's call
std::atomic<uintptr_t> g_lo{0}, g_hi{0}; // the library's executable segment
std::atomic<uintptr_t> g_base{0};          // where the library is loaded
std::atomic<long> g_through{0};
pthread_t g_thread;                        // the arming thread

int find_library(struct dl_phdr_info *info, size_t, void *) {
  const char *name = info->dlpi_name != nullptr ? std::strrchr(info->dlpi_name, '/') : nullptr;
  if (name == nullptr || std::strcmp(name + 1, "libunderstudy.so") != 0)
    return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) &ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      g_base = info->dlpi_addr;
      g_lo = info->dlpi_addr + ph.p_vaddr;
      g_hi = info->dlpi_addr + ph.p_vaddr + ph.p_memsz;
      return 1;
    }
  }
  return 0;
}

// Whether the allocation called from caller fails.
bool fails(void *caller) {
  g_through.fetch_add(1, std::memory_order_relaxed);
  const uintptr_t at = reinterpret_cast<uintptr_t>(caller);
  if (g_countdown.load(std::memory_order_acquire) < 0 || at < g_lo.load() || at >= g_hi.load() ||
      !pthread_equal(pthread_self(), g_thread))
    return false;
  g_seen.fetch_add(1);
  if (g_countdown.fetch_sub(1) != 0)
    return false;
  g_failed.fetch_add(1);
  g_failed_at = at - g_base.load();
  return true;
}

void *allocate(std::size_t n, void *caller) {
  if (fails(caller))
    throw std::bad_alloc();
  void *p = __libc_malloc(n != 0 ? n : 1);
  if (p == nullptr)
    throw std::bad_alloc();
  return p;
}

} // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT int fail_new_arm(long n) {
  if (g_hi.load() == 0)
    dl_iterate_phdr(find_library, nullptr);
  if (g_hi.load() == 0)
    return -1;
  g_seen = 0;
  g_thread = pthread_self();
  g_countdown.store(n < 0 ? -1 : n, std::memory_order_release);
  return 0;
}

EXPORT long fail_new_seen(void) { return g_seen.load(); }
EXPORT long fail_new_failed(void) { return g_failed.load(); }
EXPORT unsigned long fail_new_failed_at(void) { return g_failed_at.load(); }
EXPORT long fail_new_through(void) { return g_through.load(); }

EXPORT void *malloc(size_t n) {
  if (fails(__builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_malloc(n);
}

EXPORT void *calloc(size_t n, size_t size) {
  if (fails(__builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_calloc(n, size);
}

EXPORT void *realloc(void *p, size_t n) {
  if (n != 0 && fails(__builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_realloc(p, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n) {
  if (fails(__builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_memalign(align, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
  if (fails(__builtin_return_address(0)))
    return ENOMEM;
  if (align < sizeof(void *) || (align & (align - 1)) != 0)
    return EINVAL;
  void *p = __libc_memalign(align, n);
  if (p == nullptr)
    return ENOMEM;
  *out = p;
  return 0;
}

__attribute__((visibility("default"))) void *operator new(std::size_t n) {
  return allocate(n, __builtin_return_address(0));
}
__attribute__((visibility("default"))) void *operator new[](std::size_t n) {
  return allocate(n, __builtin_return_address(0));
}
__attribute__((visibility("default"))) void operator delete(void *p) noexcept { std::free(p); }
__attribute__((visibility("default"))) void operator delete[](void *p) noexcept { std::free(p); }
__attribute__((visibility("default"))) void operator delete(void *p, std::size_t) noexcept { std::free(p); }
__attribute__((visibility("default"))) void operator delete[](void *p, std::size_t) noexcept { std::free(p); }
