/* The stand-in libcupti's clock (tests/c/fake_cupti.c), for the tests that
 * run the kernel tracer against it. */
#ifndef UST_TEST_FAKE_CUPTI_H
#define UST_TEST_FAKE_CUPTI_H

#include <dlfcn.h>
#include <stdint.h>

#include "runner.h"

/* The tracer's monotonic clock (dispatch/timer_cupti.c). */
extern uint64_t (*ust__cupti_clock)(void);

typedef struct fake_clock {
  void (*advance)(uint64_t ns); /* time passing between two steps of the test */
  void (*step)(uint64_t ns);    /* how far each reading moves the clock (1 ms until set) */
} fake_clock;

/* Loads the stand-in libcupti (the tracer later finds it loaded) and makes
 * its clock the tracer's: call before a tracer is made. */
static inline fake_clock fake_clock_install(void) {
  void *h = dlopen(UST_FAKE_CUPTI, RTLD_NOW);
  ASSERT_TRUE(h != NULL);
  fake_clock c;
  *(void **)&ust__cupti_clock = dlsym(h, "fake_cupti_clock_ns");
  *(void **)&c.advance = dlsym(h, "fake_cupti_clock_advance");
  *(void **)&c.step = dlsym(h, "fake_cupti_clock_step");
  ASSERT_TRUE(ust__cupti_clock != NULL && c.advance != NULL && c.step != NULL);
  return c;
}

#endif
