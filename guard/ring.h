/*
 * guard/ring.h: comparison results out of CUDA graphs. A comparison captured
 * into a graph runs at every replay, where no host code runs, so its
 * statistics reach the host through a ring the device writes and the host
 * reads.
 *
 * The writer (ust__ring_publish_launch, a kernel captured after the
 * comparison it reports) takes the next publication number from a counter
 * in device memory, clears the sequence word of that number's entry (modulo
 * the ring's size) in host-mapped memory, writes the entry, fences, and
 * writes the sequence word last: the publication number + 1. The reader
 * (the host, off the serving path) takes entries in publication order; an
 * entry is whole when its sequence word reads the number it waits for
 * before and after its words were copied. An entry overwritten before the
 * reader came to it, or while it read it, is counted lost, never misread;
 * one not yet written ends the harvest until the next.
 *
 * Threading: any number of writers (device threads, or host threads in the
 * tests), as long as fewer than size publications are being written at
 * once (two writers a lap apart in one entry would interleave their words);
 * one harvest at a time (the ring serialises them).
 *
 * Valid C, C++ and CUDA/HIP. Includes only base/ and guard/compare.h.
 * Internal header: never installed.
 */
#ifndef UST_GUARD_RING_H
#define UST_GUARD_RING_H

#include <stdint.h>

#include "guard/compare.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One publication: the statistics of one captured call's pairs, in the
 * order the call's comparisons were captured. Words of 8 bytes only, so
 * that the reader copies it word by word. */
typedef struct ust__ring_entry {
  unsigned long long seq;  /* publication number + 1 once whole; 0 while written (or never) */
  unsigned int site;       /* the captured call it reports: the host's id for it */
  unsigned short n_pairs;  /* stats[0 .. n_pairs) */
  unsigned short runs;     /* the replay's run bits (guard/gate.h): whether the candidate served it */
  ust__cmp_stats stats[UST__MAX_PAIRS];
} ust__ring_entry;

#define UST__RING_WORDS (sizeof(ust__ring_entry) / 8u)

/* What the writer kernel needs: device addresses. */
typedef struct ust__ring_dev {
  unsigned long long *words;   /* the entries, host-mapped memory seen from the device */
  unsigned long long *counter; /* the next publication number, device memory */
  unsigned int size;           /* entries, a power of two */
} ust__ring_dev;

typedef struct ust__ring ust__ring;

/* A ring of size entries (a power of two, 2 .. 65536). on_device: its
 * entries in host memory mapped for the device and its counter in device
 * memory (a GPU build; UST_EGPU without one or without a device); else both
 * in host memory, written by host threads (ust__ring_host_publish). */
int ust__ring_create(uint32_t size, int on_device, ust__ring **out);
void ust__ring_destroy(ust__ring *r);

ust__ring_dev ust__ring_device(const ust__ring *r);

/* Each entry published since the last harvest and whole, in publication
 * order, to fn (on the calling thread); returns how many. */
typedef void (*ust__ring_fn)(void *ctx, const ust__ring_entry *e);
uint64_t ust__ring_harvest(ust__ring *r, ust__ring_fn fn, void *ctx);

/* Entries lost so far (overwritten before or while they were read), and
 * the next publication number the reader waits for. */
uint64_t ust__ring_lost(const ust__ring *r);
uint64_t ust__ring_next(const ust__ring *r);

/* A host ring's writer (on_device 0): publishes site's n_pairs statistics
 * and a replay's run bits with the device's protocol; returns the
 * publication number. */
uint64_t ust__ring_host_publish(ust__ring *r, unsigned int site, const ust__cmp_stats *stats, unsigned int n_pairs,
                                unsigned int runs);

/* The device's writer: enqueue on stream (capturable) the publication of
 * n_pairs statistics at dev_stats (device memory) for site; when not NULL,
 * only if the device word at when has UST__GATE_RUN_VERIFY (guard/gate.h)
 * set as it runs. 0, or UST_EGPU (a build without a GPU backend: always). */
int ust__ring_publish_launch(const ust__ring_dev *d, unsigned int site, const ust__cmp_stats *dev_stats,
                             unsigned int n_pairs, const unsigned long long *when, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* UST_GUARD_RING_H */
