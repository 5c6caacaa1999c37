/* The rule that decides each replay of a captured call on the device
 * (guard/gate.h): the same shares as the host's sampler, its gate word,
 * and the decisions of each mode over a run of replays. */
#include <stdint.h>

#include "runner.h"

#include "base/base.h"
#include "guard/gate.h"

/* floor(n q / 2^32) in 128-bit arithmetic: the ground truth for the 64-bit rule */
static int hit_128(uint64_t n, uint32_t q) {
  if (q == UINT32_MAX)
    return 1;
  if (n == 0)
    return 0;
  const unsigned __int128 a = (unsigned __int128)n * q, b = (unsigned __int128)(n - 1) * q;
  return (uint64_t)(a >> 32) != (uint64_t)(b >> 32);
}

TEST(share_rule_in_64_bits_is_exact_up_to_2_64) {
  /* the rule the host's sampler and the device's gate share (base/share.h) */
  const uint32_t qs[] = {0, 1, 3, ust__share_q32(0.001), ust__share_q32(0.25), ust__share_q32(1.0 / 3),
                         ust__share_q32(0.5), 0x80000001u, ust__share_q32(0.999), UINT32_MAX - 1, UINT32_MAX};
  const uint64_t starts[] = {1, (1ull << 31) - 1500, (1ull << 32) - 5000, (1ull << 63) + 12345, UINT64_MAX - 3000};
  for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++)
    for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++)
      for (uint64_t n = starts[s]; n < starts[s] + 3000 && n >= starts[s]; n++)
        if (ust__share_hit(n, qs[i]) != hit_128(n, qs[i]) || ust__sampled(n, qs[i]) != hit_128(n, qs[i])) {
          ASSERT_U64_EQ(n, 0); /* names the first n that differs */
          ASSERT_U64_EQ(qs[i], 0);
        }
}

TEST(gate_word_round_trips_mode_and_shares) {
  const int modes[] = {UST__GATE_OFF, UST__GATE_SHADOW, UST__GATE_CANARY, UST__GATE_LIVE};
  const uint32_t qs[] = {0, 2, ust__share_q32(0.25), 0xfffffffeu, UINT32_MAX};
  for (int m = 0; m < 4; m++)
    for (int a = 0; a < 5; a++)
      for (int b = 0; b < 5; b++) {
        ust__replay_gate g = {modes[m], qs[a], qs[b]};
        ust__replay_gate back = ust__gate_unpack(ust__gate_pack(g));
        ASSERT_INT_EQ(back.mode, g.mode);
        /* all stays all; any other share loses at most its lowest bit (2^-32) and never becomes all */
        ASSERT_TRUE(g.sample_q32 == UINT32_MAX ? back.sample_q32 == UINT32_MAX
                                               : g.sample_q32 - back.sample_q32 <= 3 && back.sample_q32 != UINT32_MAX);
        ASSERT_TRUE(g.canary_q32 == UINT32_MAX ? back.canary_q32 == UINT32_MAX
                                               : g.canary_q32 - back.canary_q32 <= 3 && back.canary_q32 != UINT32_MAX);
      }
}

typedef struct tally {
  uint64_t candidate, verified, verified_candidate, verified_production;
} tally;

/* replays from..to of a site, its counters carried as the device keeps them */
static void replay(uint64_t word, uint64_t *n, uint64_t *served, uint64_t count, tally *t) {
  for (uint64_t i = 0; i < count; i++) {
    const ust__gate_choice c = ust__gate_decide(ust__gate_unpack(word), ++*n, *served);
    *served += c.candidate != 0;
    t->candidate += c.candidate != 0;
    t->verified += c.verify != 0;
    t->verified_candidate += c.verify && c.candidate;
    t->verified_production += c.verify && !c.candidate;
  }
}

TEST(gate_decides_each_replay_as_the_modes_decide_eager_calls) {
  const uint32_t quarter = ust__share_q32(0.25), half = ust__share_q32(0.5), tenth = ust__share_q32(0.1);
  uint64_t n = 0, served = 0;
  tally t = {0};
  replay(ust__gate_pack((ust__replay_gate){UST__GATE_OFF, UINT32_MAX, UINT32_MAX}), &n, &served, 1000, &t);
  ASSERT_U64_EQ(t.candidate + t.verified, 0); /* off: production, nothing verified */
  t = (tally){0};
  replay(ust__gate_pack((ust__replay_gate){UST__GATE_SHADOW, quarter, UINT32_MAX}), &n, &served, 10000, &t);
  ASSERT_U64_EQ(t.candidate, 0);
  ASSERT_U64_EQ(t.verified_production, 2500); /* shadow: production serves, a quarter verified */
  t = (tally){0};
  replay(ust__gate_pack((ust__replay_gate){UST__GATE_CANARY, half, quarter}), &n, &served, 10000, &t);
  ASSERT_U64_EQ(t.candidate, 2500);          /* a quarter served by the candidate */
  ASSERT_U64_EQ(t.verified_candidate, 1250); /* half of those verified */
  ASSERT_U64_EQ(t.verified_production, 0);
  t = (tally){0};
  replay(ust__gate_pack((ust__replay_gate){UST__GATE_LIVE, tenth, 0}), &n, &served, 10000, &t);
  ASSERT_U64_EQ(t.candidate, 10000);
  ASSERT_U64_EQ(t.verified_candidate, 1000);
  /* a rollback is a word written between replays: the next one is production's */
  t = (tally){0};
  replay(ust__gate_pack((ust__replay_gate){UST__GATE_OFF, tenth, 0}), &n, &served, 100, &t);
  ASSERT_U64_EQ(t.candidate + t.verified, 0);
  /* evenly spread: each block of 40 replays of a quarter canary holds 10 served */
  uint64_t m = 0, s = 0;
  for (int w = 0; w < 50; w++) {
    tally u = {0};
    replay(ust__gate_pack((ust__replay_gate){UST__GATE_CANARY, 0, quarter}), &m, &s, 40, &u);
    ASSERT_U64_EQ(u.candidate, 10);
  }
}

TEST(a_site_that_cannot_serve_is_verified_as_in_shadow) {
  /* canary and live words for a site whose results cannot be copied over
   * production's: its sample of replays verified, none served; shadow and
   * off words unchanged */
  const uint32_t quarter = ust__share_q32(0.25), half = ust__share_q32(0.5);
  const int modes[] = {UST__GATE_CANARY, UST__GATE_LIVE};
  for (int m = 0; m < 2; m++) {
    uint64_t n = 0, served = 0;
    tally t = {0};
    replay(ust__gate_verify_only(ust__gate_pack((ust__replay_gate){modes[m], half, quarter})), &n, &served, 1000, &t);
    ASSERT_U64_EQ(t.candidate, 0);
    ASSERT_U64_EQ(t.verified_production, 500);
  }
  const uint64_t shadow = ust__gate_pack((ust__replay_gate){UST__GATE_SHADOW, half, quarter});
  ASSERT_U64_EQ(ust__gate_verify_only(shadow), shadow);
  ASSERT_U64_EQ(ust__gate_verify_only(0), 0);
}
