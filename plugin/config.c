/* The JSON config: parsed strictly, every error names its JSON path. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "plugin/plugin.h"
#include "plugin/verify.h"

/* ---- the field table -----------------------------------------------------------------
 * Every field of the config, each object's keys in the order its errors list
 * them (plugin.h says what each column means). An entry with AT(...) is kept
 * where it names; its section's parser passes the struct. */

#define AT(type, member) .offset = offsetof(type, member), .size = sizeof(((type *)0)->member)
#define CHOICES(...) .choices = (const char *const[]){__VA_ARGS__, NULL}
/* the sections of an operator's entry */
#define SEC_OP "operators.<name>"
#define SEC_CANDIDATE SEC_OP ".candidate"
#define SEC_GUARD SEC_OP ".guard"
#define SEC_PROMOTION SEC_OP ".promotion"
#define SEC_ROUTE SEC_OP ".routes.<key>"

static const ust__config_field fields[] = {
    /* ---- the top level */
    {"", "version", UST__FIELD_INTEGER, .lo = 1, .hi = 1, .def = "1",
     .doc = "The config format's version."},
    {"", "problems_dir", UST__FIELD_STRING, AT(ust__config, problems_dir), .def_words = "the shipped `problems/`",
     .doc = "The folder of operator definitions, one JSON file per operator. The Python package passes its own "
            "unless this field or `enable(problems=...)` names one; a C host names it here or in `ust_enable`."},
    {"", "report", UST__FIELD_OBJECT,
     .doc = "The JSON report: where it is written and how often, and the recent window it gives beside the totals."},
    {"", "log_level", UST__FIELD_CHOICE, CHOICES("error", "warn", "info", "debug"), AT(ust__config, log_level),
     .def = "\"warn\"", .doc = "The most detailed messages logged (to stderr, or to the sink a host set with "
                               "`ust_set_log`)."},
    /* about 17 KiB a route (two histograms of 976 buckets, the key, its row of the rollout table) */
    {"", "max_routes", UST__FIELD_INTEGER, .lo = 1, .hi = 65536, AT(ust__config, max_routes), .def = "4096",
     .doc = "Routes (an operator's shape keys) tracked at most, about 17 KiB each; calls of keys beyond them are "
            "served by production and counted `untracked`. The shape keys given under operators' `routes` count "
            "against it too."},
    {"", "defaults", UST__FIELD_OBJECT, .doc = "What every operator does unless its own entry says otherwise."},
    {"", "operators", UST__FIELD_MAP, .def_words = "every definition, in `defaults.mode`",
     .doc = "The operators to intercept, by the name of their definition: each a mode string or an object. An "
            "operator not listed is not intercepted at all."},
    {"", "shadow", UST__FIELD_OBJECT,
     .doc = "Limits on shadowed calls, and how a shadow is run for calls captured into CUDA graphs."},
    {"", "hardware", UST__FIELD_OBJECT,
     .doc = "The hardware profiles that give each call's roofline floor (T_SOL), against which kernels are scored."},
    {"", "state", UST__FIELD_OBJECT,
     .doc = "The rollout state file, which keeps each route's own mode and the promotion's decisions across "
            "restarts. Without it they last as long as the process."},
    {"", "disable_timeout_s", UST__FIELD_NUMBER, .what = "a number of seconds", .lo = 0, .lo_open = 1, .hi = 86400,
     AT(ust__config, disable_timeout_s), .def = "30",
     .doc = "How long `disable()` waits for intercepted calls still inside a candidate before it returns "
            "`UST_ETIMEDOUT`. Interception stops at once either way; the final report and state are written when "
            "those calls return."},
    {"", "metrics", UST__FIELD_OBJECT, .def_words = "none: no metrics",
     .doc = "Prometheus metrics, set up by the Python package at `enable()` (the C core only checks the fields): "
            "with `port`, an endpoint of its own; without, into the host's Prometheus (its multiprocess directory "
            "or its default registry)."},
    {"", "timer", UST__FIELD_OBJECT,
     .doc = "What times calls on a GPU: events around each timed call, or CUPTI's kernel tracer in windows."},

    /* ---- report */
    {"report", "path", UST__FIELD_PATH, AT(ust__config, report_path), .def_words = "none: no report file",
     .doc = "The report file, written atomically (temporary file, fsync, rename) every `interval_s` seconds and at "
            "disable. `{pid}`, `{rank}` and `{local_rank}` are replaced, so that processes sharing one config "
            "write files of their own."},
    {"report", "interval_s", UST__FIELD_NUMBER, .lo = 0, .hi = INFINITY, AT(ust__config, report_interval_s),
     .def = "10", .doc = "Seconds between two reports; 0 writes it only at disable."},
    {"report", "window_s", UST__FIELD_NUMBER, .what = "a number of seconds", .lo = 0, .hi = 86400,
     AT(ust__config, report_window_s), .def = "60",
     .doc = "The length of the report's `window`: figures over the recent calls (between one and two windows "
            "back) beside the totals; 0: no window."},

    /* ---- hardware */
    {"hardware", "dir", UST__FIELD_STRING, AT(ust__config, hardware_dir), .def_words = "`<problems_dir>/hardware`",
     .doc = "The folder of hardware profiles, one JSON file per device: the shipped datasheet ones, or one that "
            "`understudy calibrate` measured."},
    {"hardware", "profile", UST__FIELD_STRING, AT(ust__config, hardware_profile),
     .def_words = "picked by the device's name (a CPU's by its model name)",
     .doc = "The profile, by name (`\"H200\"`), that every device's calls are scored against."},

    /* ---- state */
    {"state", "path", UST__FIELD_PATH, AT(ust__config, state_path), .def_words = "required",
     .doc = "The state file: every route's own mode and the promotion's decisions short of a move, with their "
            "evidence, written atomically after each change and at disable, read back at enable (its modes win "
            "over the config's per-key ones). Placeholders as in `report.path`."},

    /* ---- shadow */
    {"shadow", "max_inflight", UST__FIELD_INTEGER, .lo = 1, .hi = 4096, AT(ust__config, shadow_max_inflight),
     .def = "64",
     .doc = "Shadow calls whose comparison is pending, at most; beyond them a call is served by production alone "
            "and counted `skipped` (`no_slot`)."},
    {"shadow", "graph_beside_max_mb", UST__FIELD_INTEGER, .lo = 0, .hi = 65536,
     AT(ust__config, shadow_graph_beside_mb), .def = "16",
     .doc = "Device memory (MiB) a call captured into a CUDA graph may keep for its shadow beside the graph's "
            "chain; a call that would keep more is shadowed in the chain. 0: every captured shadow in the chain."},
    /* an IF node by default: "device" fails under CUPTI's kernel tracing */
    {"shadow", "graph_beside_launch", UST__FIELD_CHOICE, CHOICES("conditional", "device"),
     AT(ust__config, shadow_graph_beside_launch), .def = "\"conditional\"",
     .doc = "Where replays are decided on the device, how a replay that verifies starts a shadow beside the "
            "chain: `conditional`, an IF node on a branch off its kernel; `device`, a launch of the shadow's graph "
            "from that kernel. `device` needs `timer.kind` `events`: CUPTI's kernel tracing fails such graphs."},
    {"shadow", "graph_gate", UST__FIELD_CHOICE, CHOICES("device", "replay"),
     AT(ust__config, shadow_graph_gate_replay), .def = "\"replay\"",
     .doc = "Who decides whether a replay verifies a shadow beside the chain: `replay`, the host before each "
            "replay it sees (`torch.cuda.CUDAGraph.replay`, through the Python package); `device`, a kernel in the "
            "chain at every replay. Replays the host does not see are decided on the device either way."},
    /* behind the replay by default: nothing added to the graph, so a closed gate costs least */
    {"shadow", "graph_host_start", UST__FIELD_CHOICE, CHOICES("replay", "kernel"),
     AT(ust__config, shadow_graph_start_kernel), .def = "\"replay\"",
     .doc = "Where the host starts a shadow beside the chain in a replay that verifies (`graph_gate` `replay`): "
            "`replay`, behind the whole replay; `kernel`, behind its kernel, through an event recorded in the "
            "graph, so that it runs under the rest of the replay. Read when the graph is captured."},

    /* ---- timer */
    /* events by default: once CUPTI traced API calls, every later launch of
     * the process stays slower */
    {"timer", "kind", UST__FIELD_CHOICE, CHOICES("auto", "cupti", "events"), AT(ust__config, timer_kind),
     .def = "\"events\"",
     .doc = "`events`: an event pair on the caller's stream around each timed call, held (`timer.hold`). "
            "`cupti`: CUPTI's kernel tracer, the call's kernels' own durations, in windows; where libcupti cannot "
            "be loaded, events, saying why. `auto`: the tracer where it loads, quietly."},
    {"timer", "window_ms", UST__FIELD_NUMBER, .what = "a number of milliseconds", .lo = 1, .hi = 600000,
     AT(ust__config, timer_window_ms), .def = "100", .doc = "How long a tracer window stays open."},
    {"timer", "budget", UST__FIELD_NUMBER, .what = "a share of host time", .lo = 0, .hi = 1,
     .note = "0: windows back to back", AT(ust__config, timer_budget), .def = "0.01",
     .doc = "The share of host time the windows may cost: the next window opens once a window's kernels times "
            "`launch_cost_us` is within this share of the time since it opened."},
    {"timer", "launch_cost_us", UST__FIELD_NUMBER, .what = "a number of microseconds", .lo = 0, .hi = 1000,
     AT(ust__config, timer_launch_cost_us), .def = "10",
     .doc = "What tracing adds to one kernel launch, for the budget."},
    {"timer", "cupti_path", UST__FIELD_STRING, AT(ust__config, cupti_path),
     .def_words = "`libcupti.so.13`, as the loader finds it",
     .doc = "The libcupti to load when the process has none loaded (torch's CUDA build loads its own, which is "
            "used)."},
    /* callbacks by default: after its windows they left the least on each
     * call, and API records crashed libcupti 13.0 when flushed mid-window */
    {"timer", "correlation", UST__FIELD_CHOICE, CHOICES("records", "callbacks"), AT(ust__config, timer_callbacks),
     .def = "\"callbacks\"",
     .doc = "How the tracer tells which call launched a kernel: `callbacks`, the launch APIs' callbacks (while "
            "another client, such as torch's profiler, holds CUPTI's subscription, records are used); `records`, "
            "an id each call pushes, carried by CUPTI's API records, which makes every later API call of the "
            "process dearer. The report's `timer.correlation` says which was used."},
    /* off by default until the held figures are checked against torch.profiler on a GPU
     * (benchmarks/kernel_time.py); the state machine is tested by the C runner */
    {"timer", "hold", UST__FIELD_CHOICE, CHOICES("auto", "off"), AT(ust__config, timer_hold), .def = "\"off\"",
     .doc = "How an event pair times a GPU call. `auto`: held (docs/timing.md) — a one-thread kernel holds the "
            "stream until the call has launched its work, so the pair brackets the work run back to back, less "
            "what the pair adds (measured once per device): the kernels' own time, without the host's launch "
            "gaps. `off`: the pair as it falls, launch gaps included."},
    {"timer", "hold_deadline_us", UST__FIELD_NUMBER, .what = "a number of microseconds", .lo = 10, .hi = 1000000,
     AT(ust__config, timer_hold_deadline_us), .def = "1000",
     .doc = "A hold gives up after this long on the device, whatever the host does: a call that synchronises "
            "inside (`.item()`, `nonzero`) waits at most this long, its sample is dropped and counted, and an "
            "operator whose held calls give up twice in a row is not held again."},

    /* ---- defaults */
    {"defaults", "mode", UST__FIELD_MODE, UST__FIELD_BY_HAND, AT(ust__config, default_mode), .def = "\"observe\"",
     .doc = "The mode of operators that give none: `off` or `observe` (the other modes need a candidate, named "
            "per operator)."},
    {"defaults", "sample", UST__FIELD_NUMBER, .lo = 0, .hi = 1, AT(ust__config, default_sample), .def = "0.0625",
     .doc = "The share of calls whose latency is timed, besides the first 3 calls of every shape key (every call "
            "is counted); a key's device time is its timed calls' mean times its calls. 0 times none."},
    /* once a key has had 4096 calls (about 256 of them timed in a thread's
     * warm-up, 64 past it: each keyed one), 1 in 256 */
    {"defaults", "sample_steady", UST__FIELD_NUMBER, UST__FIELD_BY_HAND, .lo = 0, .hi = 1,
     AT(ust__config, default_sample_steady),
     .def = "3.90625e-3",
     .doc = "The timed share once a key has had `steady_after` calls, at most `sample`: it keeps timing's cost off "
            "keys already well measured. A `sample` given without `sample_steady` holds for every call."},
    {"defaults", "steady_after", UST__FIELD_COUNT, .lo = 0, .hi = 1e15, AT(ust__config, steady_after),
     .def = "4096", .doc = "The calls of a key after which it is timed at `sample_steady`."},
    /* a keyed call among tallied ones finds its view, key, route and
     * counters cold: several microseconds where a tallied call costs tenths */
    {"defaults", "key_every", UST__FIELD_COUNT, .lo = 1, .hi = 65535, .note = "1: every call keyed",
     AT(ust__config, key_every), .def = "64",
     .doc = "Past a thread's first `key_after` calls, an operator observed without a candidate builds the shape "
            "key of one call in `key_every`, at random, and only counts the others (`tallied`); a keyed call "
            "stands for `key_every` calls of its key. Calls during a CUDA graph capture or a tracer window, and "
            "every call of an operator with a candidate, are keyed one by one."},
    {"defaults", "key_after", UST__FIELD_COUNT, .lo = 0, .hi = 1e15, AT(ust__config, key_after), .def = "4096",
     .doc = "The calls a thread makes to operators observed without a candidate, each keyed, before `key_every` "
            "applies to it: a short run counts every key exactly."},

    /* ---- operators */
    {"operators", "<name>", UST__FIELD_MODE_OR_OBJECT,
     .doc = "One operator, named as its definition (`problems/<name>.json`): a mode string "
            "(`\"gemm\": \"observe\"`), or an object whose fields follow."},
    {SEC_OP, "mode", UST__FIELD_MODE, UST__FIELD_RELOADABLE, AT(ust__op_config, mode), .def_words = "`defaults.mode`",
     .doc = "`off` (intercepted, passed straight through), `observe`, `shadow`, `canary` or `live`; the last three "
            "need a `candidate`. Routes with a mode of their own (set per key, restored, promoted or rolled back) "
            "keep it."},
    {SEC_OP, "sample", UST__FIELD_NUMBER, .lo = 0, .hi = 1, AT(ust__op_config, sample),
     .def_words = "`defaults.sample`",
     .doc = "In observe, the share of calls timed; in shadow, the share of the target's calls shadowed (the others "
            "are observed); in canary and live, the share of served calls verified against production."},
    {SEC_OP, "sample_steady", UST__FIELD_NUMBER, UST__FIELD_BY_HAND, .lo = 0, .hi = 1,
     AT(ust__op_config, sample_steady),
     .def_words = "`defaults.sample_steady`, or `sample` when the operator gives one",
     .doc = "The timed share of the operator's keys once steady, as `defaults.sample_steady`; at most `sample`."},
    {SEC_OP, "candidate", UST__FIELD_OBJECT,
     .doc = "The kernel that stands in for production: a native shared object (`native`, pinned by `sha256`) or a "
            "dispatcher op (`torch_op`), exactly one of them."},
    {SEC_OP, "guard", UST__FIELD_OBJECT,
     .doc = "How the candidate's outputs are judged against production's, and when it is cut off."},
    {SEC_OP, "canary", UST__FIELD_NUMBER, UST__FIELD_RELOADABLE, .what = "a fraction of calls", .lo = 0, .lo_open = 1,
     .hi = 1, .hi_open = 1, AT(ust__op_config, canary), .def = "0.1",
     .doc = "The candidate's share of the calls in `canary` mode, spread evenly."},
    {SEC_OP, "strict", UST__FIELD_BOOL, UST__FIELD_RELOADABLE, AT(ust__op_config, strict), .def = "false",
     .doc = "In canary and live, wait for each verified call's verdict before returning it, so that a mismatch is "
            "never served (on a GPU this synchronises the stream). Inside CUDA graphs production serves and "
            "replays are verified as in shadow."},
    {SEC_OP, "promotion", UST__FIELD_OBJECT, UST__FIELD_RELOADABLE, .def_words = "none: modes move only when told",
     .doc = "The promotion policy: a route moves shadow → canary → live once enough verifications passed and a "
            "sequential test of paired times finds the candidate faster. `{}` enables it with the defaults below; "
            "it needs a `candidate`."},
    {SEC_OP, "routes", UST__FIELD_MAP, UST__FIELD_RELOADABLE, .def_words = "none",
     .doc = "Modes of single shape keys, the keys spelled as in the report "
            "(`\"_C::rms_norm|cuda|bf16,bf16,bf16|M=8,N=4096\"`)."},

    /* ---- operators.<name>.candidate: read by hand (its fields depend on each other) */
    {SEC_CANDIDATE, "native", UST__FIELD_STRING, UST__FIELD_BY_HAND,
     .doc = "The path of a native candidate, a shared object exporting the candidate ABI. It is loaded only when "
            "its SHA-256 is `sha256`, from the very bytes hashed."},
    {SEC_CANDIDATE, "sha256", UST__FIELD_STRING, UST__FIELD_BY_HAND, .what = "64 hex digits",
     .def_words = "required with `native`", .doc = "The SHA-256 of the `native` shared object, in hex."},
    {SEC_CANDIDATE, "deps", UST__FIELD_MAP, UST__FIELD_BY_HAND, .def_words = "none",
     .doc = "`{PATH: SHA256}`: the absolute paths and pins of libraries the native candidate needs that are "
            "neither system libraries nor loaded already. Each must carry its needed name as `DT_SONAME`; it is "
            "checked and loaded from its checked bytes before the candidate."},
    {SEC_CANDIDATE, "torch_op", UST__FIELD_STRING, UST__FIELD_BY_HAND,
     .doc = "A dispatcher op (`ns::name` or `ns::name.overload`) with the target's schema, called with the same "
            "arguments: a Triton kernel registered with `torch.library.custom_op`, for one."},
    {SEC_CANDIDATE, "target", UST__FIELD_STRING, UST__FIELD_BY_HAND,
     .def_words = "the native descriptor's; a torch op's is required when the operator binds several ops",
     .doc = "The bound op the candidate stands in for, with its overload (`aten::mm`, `_C::rms_norm`)."},
    {SEC_CANDIDATE, "qualify", UST__FIELD_CHOICE, UST__FIELD_BY_HAND, CHOICES("here", "process"),
     AT(ust__cand_config, qualify), .def = "\"here\"",
     .doc = "`here`: a native candidate is loaded into this process at enable. `process`: it first runs in a "
            "process of its own (`understudy-qualify`), and this process loads it only once a route qualified "
            "there. A torch op qualifies through its overload `qualify` (`ns::name.qualify`, a stand-in that "
            "runs it in a process of its own: the Python package's file and Solution candidates define one), "
            "and runs here on a route once the route qualified."},
    {SEC_CANDIDATE, "qualify_calls", UST__FIELD_INTEGER, UST__FIELD_BY_HAND, .what = "a whole number of calls",
     .lo = 1, .hi = 1000000, AT(ust__cand_config, qualify_calls), .def = "3",
     .doc = "With `qualify` `process`: the passing verifications a route needs in that process before the "
            "candidate runs here on it."},
    {SEC_CANDIDATE, "qualify_memory_mb", UST__FIELD_INTEGER, UST__FIELD_BY_HAND, .what = "a whole number of MiB",
     .lo = 16, .hi = 16777216, AT(ust__cand_config, qualify_memory_mb), .def = "4096",
     .doc = "With `qualify` `process`: the memory the candidate may take in that process, beyond what the "
            "qualifying program maps before loading it (`RLIMIT_DATA`: its heap, anonymous mappings and thread "
            "stacks; address space a GPU runtime reserves without using is not counted). A candidate that fails "
            "or crashes there within an eighth of it (at least 64 MiB) is refused as over its memory limit."},
    {SEC_CANDIDATE, "qualify_cpu_s", UST__FIELD_INTEGER, UST__FIELD_BY_HAND, .what = "a whole number of seconds",
     .lo = 1, .hi = 31536000, AT(ust__cand_config, qualify_cpu_s), .def = "600",
     .doc = "With `qualify` `process`: the CPU time that process may use over its life (`RLIMIT_CPU`); past it, it "
            "is killed (`SIGXCPU`) and the candidate refused."},

    {SEC_CANDIDATE, "source", UST__FIELD_MAP, UST__FIELD_BY_HAND, .def_words = "none",
     .doc = "Where the candidate comes from, as an object the report repeats under the operator's `candidate` "
            "(the Python package fills it: a file and its digest, a hub repository and revision, a Solution's "
            "name and hash). Its `label`, a string, names the candidate beside every route it serves and in "
            "rollback evidence."},
    {SEC_CANDIDATE, "when", UST__FIELD_MAP, UST__FIELD_BY_HAND, .def_words = "none: every route",
     .doc = "`{DIM: VALUE}`: key dimensions (as the operator's definition names them) a route must have for the "
            "candidate to run on it, such as a Solution's constant axes; on other routes production serves "
            "alone and the report says why. At most 8."},

    /* ---- operators.<name>.guard */
    {SEC_GUARD, "compare", UST__FIELD_CHOICE, UST__FIELD_BY_HAND, CHOICES("allclose", "exact", "set"),
     .def_words = "the definition's `compare`, else `allclose`",
     .doc = "`allclose`: `|c − p| ≤ atol + rtol·|p|` for every element. `exact`: equal values (−0 equals +0, NaN "
            "equals NaN). `set`: each side's "
            "rows ordered by its first output's values (ties by the second's) before comparing, for top-k values "
            "and indices."},
    {SEC_GUARD, "atol", UST__FIELD_NUMBER, .lo = 0, .hi = INFINITY, AT(ust__op_config, atol),
     .def_words = "by dtype: 1e-2 for f16 and bf16, 1e-4 for f32, 1e-8 for f64; integers exact",
     .doc = "The absolute tolerance of `allclose`."},
    {SEC_GUARD, "rtol", UST__FIELD_NUMBER, .lo = 0, .hi = INFINITY, AT(ust__op_config, rtol),
     .def_words = "by dtype: 5e-2 for f16 and bf16, 1e-3 for f32, 1e-7 for f64",
     .doc = "The relative tolerance of `allclose`."},
    /* production's own spread on each route, for the promotion's delta */
    {SEC_GUARD, "aa_sample", UST__FIELD_NUMBER, .lo = 0, .hi = 1, AT(ust__op_config, aa_sample),
     .def = "0.25",
     .doc = "The share of shadowed calls (and, where a canary's promotion is decided by speed, of its verified "
            "calls) that run production once more beside its timed run (A/A), timed and compared: production's "
            "own spread, which widens the promotion's `delta`; the test decides nothing before 8 such pairs. "
            "0: none (the test judges with `delta` alone)."},
    {SEC_GUARD, "deadline_ms", UST__FIELD_NUMBER, .what = "a number of milliseconds", .lo = 0, .lo_open = 1,
     .hi = 3.6e6, AT(ust__op_config, deadline_ms), .def = "10000",
     .doc = "A candidate call that takes longer is `overdue`: a failure, its route rolled back at the deadline "
            "while the call still runs (production serves every later call; the call's own result is production's "
            "once it returns)."},
    {SEC_GUARD, "max_slowdown", UST__FIELD_NUMBER, .lo = 1, .hi = INFINITY, AT(ust__op_config, max_slowdown),
     .def = "25",
     .doc = "Shadowing stops on a route whose candidate's median time is more than this many times production's "
            "(once the candidate has 5 timings); the report shows the route `paused`."},
    {SEC_GUARD, "repro_bytes", UST__FIELD_NUMBER, .what = "a number of bytes", .lo = 0, .hi = 1 << 30,
     AT(ust__op_config, repro_bytes), .def = "4194304",
     .doc = "A route's first failing verification is kept whole in the report when the call's tensor arguments "
            "(and both sides' outputs) fit in this many bytes: every argument's dtype, shape, strides, offset "
            "and values, both sides' values at the worst elements, and the candidate's identity; "
            "`understudy repro REPORT` replays it in a fresh process. Larger calls keep the evidence alone. "
            "0: never."},

    /* ---- operators.<name>.promotion */
    {SEC_PROMOTION, "min_verified", UST__FIELD_INTEGER, .lo = 1, .hi = 1 << 30,
     AT(ust__promotion, min_verified), .def = "100",
     .doc = "The passing verifications a route needs in a stage before it may move on."},
    {SEC_PROMOTION, "min_speedup", UST__FIELD_NUMBER, .lo = 0, .hi = INFINITY, AT(ust__promotion, min_speedup),
     .def = "1",
     .doc = "The speed-up to prove: the confidence sequence for the candidate's time over production's must lie "
            "below 1/`min_speedup`. 0: promote on correctness alone."},
    {SEC_PROMOTION, "canary", UST__FIELD_NUMBER, .what = "a fraction of calls", .lo = 0, .lo_open = 1, .hi = 1,
     .hi_open = 1, AT(ust__promotion, canary), .def = "0.1",
     .doc = "The share of calls a route promoted from shadow serves in canary, before live."},
    {SEC_PROMOTION, "dry_run", UST__FIELD_BOOL, AT(ust__promotion, dry_run), .def = "false",
     .doc = "Record what the policy would do, with its evidence, and change no mode."},
    {SEC_PROMOTION, "alpha", UST__FIELD_NUMBER, .what = "an error rate", .lo = 0, .lo_open = 1, .hi = 0.5,
     .hi_open = 1, AT(ust__promotion, alpha), .def = "0.05",
     .doc = "The sequential test's error rate: its confidence sequence for the median ratio of the candidate's "
            "time to production's has level 1 − `alpha`."},
    {SEC_PROMOTION, "delta", UST__FIELD_NUMBER, .what = "a relative difference", .lo = 0, .hi = 1, .hi_open = 1,
     AT(ust__promotion, delta), .def = "0.05",
     .doc = "Promote when the confidence sequence lies below 1 − `delta`; reject (`rejected`) when it lies above "
            "1 + `delta`; `inconclusive` when it lies between. Production's own A/A spread widens it when larger."},
    {SEC_PROMOTION, "max_samples", UST__FIELD_INTEGER, .lo = 10, .hi = 100000, AT(ust__promotion, max_samples),
     .def = "1000", .doc = "The paired samples a stage keeps; reaching them undecided is `inconclusive`."},

    /* ---- operators.<name>.routes */
    {SEC_OP ".routes", "<key>", UST__FIELD_MODE_OR_OBJECT,
     .doc = "One shape key: a mode string, or an object with its `mode` and `canary`."},
    {SEC_ROUTE, "mode", UST__FIELD_MODE, AT(ust__route_config, mode), .def_words = "required",
     .doc = "The key's mode; `shadow`, `canary` and `live` need the operator's `candidate`."},
    {SEC_ROUTE, "canary", UST__FIELD_NUMBER, .what = "a fraction of calls", .lo = 0, .lo_open = 1, .hi = 1,
     .hi_open = 1, AT(ust__route_config, canary), .def_words = "the operator's `canary`",
     .doc = "The candidate's share of this key's calls in `canary` mode."},

    /* ---- metrics: checked only, the Python package acts on them */
    {"metrics", "port", UST__FIELD_INTEGER, .lo = 0, .hi = 65535, .def_words = "none: the host's Prometheus",
     .doc = "Serve an endpoint of its own on `port` + `$LOCAL_RANK`; 0: any free port, no rank added."},
    {"metrics", "host", UST__FIELD_STRING, UST__FIELD_BY_HAND, .def_words = "`127.0.0.1`",
     .doc = "The address the endpoint binds, at most 255 characters; only with `port`."},
    {"metrics", "top_keys", UST__FIELD_INTEGER, .lo = 0, .hi = 65536, .def = "0",
     .doc = "Shape keys per operator with series of their own (a `key` label), those with the most device time; "
            "the others are summed into `key=\"other\"`. 0: series per operator and phase only, no `key` label."},
    {"metrics", "model_name", UST__FIELD_STRING, .def_words = "the host's (vLLM, SGLang, Hugging Face) where known",
     .doc = "The `model_name` label on every series, to join them with the engine's own (vLLM's carry it)."},
    {"metrics", "engine", UST__FIELD_STRING, .def_words = "`vllm`, `sglang`, `transformers` or `torch`, from the host",
     .doc = "The `engine` label on every series."},
};

#undef CHOICES
#undef AT

const ust__config_field *ust__config_fields(int *n) {
  *n = (int)(sizeof fields / sizeof fields[0]);
  return fields;
}

/* The entry of name in section, or NULL. */
static const ust__config_field *field_find(const char *sec, const char *name) {
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (strcmp(fields[i].section, sec) == 0 && strcmp(fields[i].name, name) == 0)
      return &fields[i];
  return NULL;
}

/* A bound as the messages write it: 3600000 and 1e15, not 3.6e+06 and 1e+15. */
static void format_bound(double x, char *buf, size_t cap) {
  const double e = x > 0 && isfinite(x) ? floor(log10(x) + 0.5) : 0;
  if (isinf(x))
    snprintf(buf, cap, "%s", x > 0 ? "inf" : "-inf");
  else if (x == floor(x) && fabs(x) < 1e12)
    snprintf(buf, cap, "%.0f", x);
  else if (e >= 12 && x == pow(10, e))
    snprintf(buf, cap, "1e%.0f", e);
  else
    snprintf(buf, cap, "%g", x);
}

void ust__config_field_expects(const ust__config_field *f, char *buf, size_t cap) {
  char lo[32], hi[32];
  format_bound(f->lo, lo, sizeof lo);
  format_bound(f->hi, hi, sizeof hi);
  const char *what = f->what;
  size_t n = 0;
  buf[0] = '\0';
  switch (f->type) {
  case UST__FIELD_INTEGER:
  case UST__FIELD_COUNT:
  case UST__FIELD_NUMBER:
    if (what == NULL)
      what = f->type == UST__FIELD_INTEGER ? "an integer" : f->type == UST__FIELD_COUNT ? "a whole number of calls"
                                                                                          : "a number";
    if (f->lo == f->hi)
      snprintf(buf, cap, "%s", lo);
    else if (isinf(f->hi))
      snprintf(buf, cap, "%s %s %s", what, f->lo_open ? ">" : ">=", lo);
    else
      snprintf(buf, cap, "%s in %c%s, %s%c", what, f->lo_open ? '(' : '[', lo, hi, f->hi_open ? ')' : ']');
    break;
  case UST__FIELD_BOOL:
    snprintf(buf, cap, "true or false");
    break;
  case UST__FIELD_STRING:
  case UST__FIELD_PATH:
    snprintf(buf, cap, "%s", what != NULL ? what : "a non-empty string");
    break;
  case UST__FIELD_CHOICE:
    n = (size_t)snprintf(buf, cap, "one of ");
    for (int i = 0; f->choices[i] != NULL && n < cap; i++)
      n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", f->choices[i]);
    break;
  case UST__FIELD_MODE:
    snprintf(buf, cap, "one of off, observe, shadow, canary, live");
    break;
  case UST__FIELD_MODE_OR_OBJECT:
    snprintf(buf, cap, "a mode string or an object");
    break;
  default:
    snprintf(buf, cap, "an object");
    break;
  }
  n = strlen(buf);
  if (f->note != NULL && n < cap)
    snprintf(buf + n, cap - n, " (%s)", f->note);
}

/* The keys of section sec, comma separated, into list (cap bytes). */
static void section_keys(const char *sec, char *list, size_t cap) {
  list[0] = '\0';
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (strcmp(fields[i].section, sec) == 0) {
      if (list[0] != '\0')
        strncat(list, ", ", cap - strlen(list) - 1);
      strncat(list, fields[i].name, cap - strlen(list) - 1);
    }
}

/* Fails with a message naming `path` unless every key of obj is a field of
 * section sec. */
static int check_keys(const cJSON *obj, const char *path, const char *sec) {
  for (const cJSON *it = obj->child; it != NULL; it = it->next) {
    const ust__config_field *f = field_find(sec, it->string);
    if (f == NULL || f->name[0] == '<') {
      char list[256];
      section_keys(sec, list, sizeof list);
      return ust__error(UST_ECONFIG, "config: unknown field '%s%s%s' (expected one of: %s)", path,
                        *path ? "." : "", it->string, list);
    }
  }
  return 0;
}

/* v, at path, must be an object whose keys are all fields of section sec;
 * the error lists them. */
static int section(const cJSON *v, const char *path, const char *sec) {
  if (!cJSON_IsObject(v)) {
    char list[256];
    section_keys(sec, list, sizeof list);
    return ust__error(UST_ECONFIG, "config: '%s' must be an object {%s}", path, list);
  }
  return check_keys(v, path, sec);
}

static int parse_mode(const cJSON *v, const char *path, int *mode) {
  if (!cJSON_IsString(v))
    return ust__error(UST_ECONFIG, "config: '%s' must be a string (off, observe, shadow, canary, live)", path);
  if (ust__mode_parse(v->valuestring, mode) != 0)
    return ust__error(UST_ECONFIG, "config: '%s' is '%s'; expected off, observe, shadow, canary or live", path,
                      v->valuestring);
  return 0;
}

static int parse_string(const cJSON *v, const char *path, char **out) {
  if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
    return ust__error(UST_ECONFIG, "config: '%s' must be a non-empty string", path);
  free(*out);
  *out = ust__strdup(v->valuestring);
  return *out == NULL ? ust__error(UST_ENOMEM, "config: out of memory") : 0;
}

/* ---- placeholders in paths ---------------------------------------------------------
 * Many processes (tensor-parallel ranks, a server's workers) often share one
 * config: {pid}, {rank} and {local_rank} give each its own report and state
 * file. A rank comes from the variables launchers set, the first one present:
 * torchrun's (and torch.distributed's env:// convention), OpenMPI's, MPICH's
 * (Hydra), Slurm's. */

static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
static const char *const local_rank_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                              "SLURM_LOCALID", NULL};

/* The first of vars set in the environment, as a decimal rank into buf. */
static int rank_from_env(const char *subject, const char *name, const char *const *vars, char *buf, size_t cap) {
  for (int i = 0; vars[i] != NULL; i++) {
    const char *v = getenv(vars[i]);
    if (v == NULL || v[0] == '\0')
      continue;
    size_t n = strspn(v, "0123456789");
    if (n == 0 || n > 9 || v[n] != '\0')
      return ust__error(UST_ECONFIG, "%s uses {%s}, but %s is '%.32s', not a rank (a whole number >= 0)",
                        subject, name, vars[i], v);
    snprintf(buf, cap, "%ld", strtol(v, NULL, 10));
    return 0;
  }
  return ust__error(UST_ECONFIG, "%s uses {%s}, but none of %s, %s, %s or %s is set in this process's "
                    "environment (the launcher sets them: torchrun, mpirun, srun); {pid} names every process apart",
                    subject, name, vars[0], vars[1], vars[2], vars[3]);
}

int ust__path_expand(const char *subject, const char *templ, char **out) {
  *out = NULL;
  size_t cap = strlen(templ) + 1, len = 0;
  char *buf = malloc(cap);
  if (buf == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  for (const char *p = templ; *p != '\0';) {
    char value[32];
    const char *piece = value;
    size_t n;
    if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
      piece = p, n = 1, p += 2;
    } else if (p[0] == '}') {
      free(buf);
      return ust__error(UST_ECONFIG, "%s has a single '}' at offset %d (write '}}' for a brace)", subject,
                        (int)(p - templ));
    } else if (p[0] == '{') {
      const char *end = strchr(p, '}');
      const int name_len = end != NULL ? (int)(end - p - 1) : 0;
      int rc = 0;
      if (end == NULL) {
        rc = ust__error(UST_ECONFIG, "%s has a '{' at offset %d that is never closed (write '{{' for a "
                        "brace)", subject, (int)(p - templ));
      } else if (name_len == 3 && strncmp(p + 1, "pid", 3) == 0) {
        snprintf(value, sizeof value, "%ld", (long)getpid());
      } else if (name_len == 4 && strncmp(p + 1, "rank", 4) == 0) {
        rc = rank_from_env(subject, "rank", rank_vars, value, sizeof value);
      } else if (name_len == 10 && strncmp(p + 1, "local_rank", 10) == 0) {
        rc = rank_from_env(subject, "local_rank", local_rank_vars, value, sizeof value);
      } else {
        rc = ust__error(UST_ECONFIG, "%s has an unknown placeholder '{%.*s}' (known: {pid}, {rank}, "
                        "{local_rank}; '{{' and '}}' for braces)", subject, name_len > 64 ? 64 : name_len, p + 1);
      }
      if (rc != 0) {
        free(buf);
        return rc;
      }
      n = strlen(value);
      p = end + 1;
    } else {
      n = strcspn(p, "{}");
      piece = p;
      p += n;
    }
    if (len + n + 1 > cap) {
      char *grown = realloc(buf, cap = 2 * (len + n + 1));
      if (grown == NULL) {
        free(buf);
        return ust__error(UST_ENOMEM, "config: out of memory");
      }
      buf = grown;
    }
    memcpy(buf + len, piece, n);
    buf[len += n] = '\0';
  }
  *out = buf;
  return 0;
}

int ust_expand_path(const char *templ, char **out) {
  ust__clear_error();
  if (out == NULL)
    return ust__error(UST_EINVAL, "expand_path: out is NULL");
  *out = NULL;
  if (templ == NULL)
    return ust__error(UST_EINVAL, "expand_path: the path is NULL");
  char subject[96];
  snprintf(subject, sizeof subject, "path '%.64s%s'", templ, strlen(templ) > 64 ? "..." : "");
  return ust__path_expand(subject, templ, out);
}

/* A path field: a non-empty string, its placeholders expanded. */
static int parse_path(const cJSON *v, const char *field, char **out) {
  if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
    return ust__error(UST_ECONFIG, "config: '%s' must be a non-empty string", field);
  char subject[64];
  snprintf(subject, sizeof subject, "config: '%s'", field);
  free(*out);
  return ust__path_expand(subject, v->valuestring, out);
}

/* ---- plain fields, through the table -------------------------------------------------- */

/* A value the table checks and keeps by itself: no object. */
static int is_plain(const ust__config_field *f) {
  return f->type != UST__FIELD_OBJECT && f->type != UST__FIELD_MAP && f->type != UST__FIELD_MODE_OR_OBJECT;
}

/* Checks v, the value of field f at path, and keeps it in base at f's
 * offset (nowhere when f has no place or base is NULL). */
static int field_parse(const ust__config_field *f, const cJSON *v, const char *path, void *base) {
  void *at = base != NULL && f->size > 0 ? (char *)base + f->offset : NULL;
  switch (f->type) {
  case UST__FIELD_INTEGER:
  case UST__FIELD_COUNT:
  case UST__FIELD_NUMBER: {
    const double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(x) || !(f->lo_open ? x > f->lo : x >= f->lo) || !(f->hi_open ? x < f->hi : x <= f->hi) ||
        (f->type != UST__FIELD_NUMBER && x != floor(x)))
      break;
    if (at == NULL)
      return 0;
    if (f->type == UST__FIELD_NUMBER)
      *(double *)at = x;
    else if (f->type == UST__FIELD_INTEGER)
      *(int *)at = (int)x;
    else if (f->size == sizeof(uint32_t))
      *(uint32_t *)at = (uint32_t)x;
    else
      *(uint64_t *)at = (uint64_t)x;
    return 0;
  }
  case UST__FIELD_BOOL:
    if (!cJSON_IsBool(v))
      break;
    if (at != NULL)
      *(int *)at = cJSON_IsTrue(v);
    return 0;
  case UST__FIELD_CHOICE:
    for (int i = 0; f->choices[i] != NULL && cJSON_IsString(v); i++)
      if (strcmp(v->valuestring, f->choices[i]) == 0) {
        if (at != NULL)
          *(int *)at = i;
        return 0;
      }
    break;
  case UST__FIELD_STRING:
  case UST__FIELD_PATH: {
    char *text = NULL;
    char **out = at != NULL ? (char **)at : &text;
    int rc = f->type == UST__FIELD_STRING ? parse_string(v, path, out) : parse_path(v, path, out);
    free(text);
    return rc;
  }
  case UST__FIELD_MODE: {
    int mode = 0, rc = parse_mode(v, path, &mode);
    if (rc == 0 && at != NULL)
      *(int *)at = mode;
    return rc;
  }
  default:
    return 0; /* an object: its section's code reads it */
  }
  char expects[192];
  ust__config_field_expects(f, expects, sizeof expects);
  return ust__error(UST_ECONFIG, "config: '%s' must be %s", path, expects);
}

/* A section's code for the fields the table does not read alone: f, its
 * value v at path. */
typedef int (*by_hand_fn)(const ust__config_field *f, const cJSON *v, const char *path, void *ctx);

/* The fields of obj, the object at path whose keys are section sec's, in
 * the table's order: each plain one present checked and kept in base, each
 * other one handed to by_hand (NULL: its section's code reads it later). */
static int fields_parse(const char *sec, const cJSON *obj, const char *path, void *base, by_hand_fn by_hand,
                        void *ctx) {
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    const ust__config_field *f = &fields[i];
    const int plain = is_plain(f) && !(f->flags & UST__FIELD_BY_HAND);
    if (strcmp(f->section, sec) != 0 || (!plain && by_hand == NULL))
      continue;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, f->name);
    if (v == NULL)
      continue;
    char sub[UST__NAME_MAX + 1024];
    snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", f->name);
    int rc = plain ? field_parse(f, v, sub, base) : by_hand(f, v, sub, ctx);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* A field in the table that its section's code does not read: a bug here,
 * refused rather than ignored. */
static int no_hand(const char *path) {
  return ust__error(UST_EINTERNAL, "config: '%s' is in the field table but nothing reads it", path);
}

/* Every field of section sec that has a default and a place: set to its
 * default in base, read as a value given in the config would be. */
static int fields_default(const char *sec, void *base) {
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    const ust__config_field *f = &fields[i];
    if (strcmp(f->section, sec) != 0 || f->def == NULL || f->size == 0)
      continue;
    cJSON *v = cJSON_Parse(f->def);
    if (v == NULL)
      return ust__error(UST_ENOMEM, "config: out of memory");
    char path[UST__NAME_MAX + 64];
    snprintf(path, sizeof path, "the default of %s%s%s", sec, *sec ? "." : "", f->name);
    int rc = field_parse(f, v, path, base);
    cJSON_Delete(v);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* The section `name` of root, when present: its keys checked, its fields
 * read as fields_parse says. *out receives it, or NULL. */
static int section_parse(const cJSON *root, const char *name, void *base, by_hand_fn by_hand, void *ctx,
                         const cJSON **out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
  *out = v;
  if (v == NULL)
    return 0;
  int rc = section(v, name, name);
  return rc != 0 ? rc : fields_parse(name, v, name, base, by_hand, ctx);
}

/* sample_steady (f, its value v at path), kept in base: a share no greater
 * than its section's sample. */
static int parse_steady(const ust__config_field *f, const cJSON *v, const char *path, void *base, double sample) {
  int rc = field_parse(f, v, path, base);
  const double steady = *(const double *)((const char *)base + f->offset);
  if (rc == 0 && steady > sample)
    rc = ust__error(UST_ECONFIG, "config: '%s' (%g) must not be above '%.*s.sample' (%g): it is the share once a key "
                    "is steady", path, steady, (int)(strlen(path) - strlen(".sample_steady")), path, sample);
  return rc;
}

/* A sample given without sample_steady (in obj) holds for every call. */
static void steady_follows_sample(const cJSON *obj, double sample, double *steady) {
  if (cJSON_GetObjectItemCaseSensitive(obj, "sample") != NULL &&
      cJSON_GetObjectItemCaseSensitive(obj, "sample_steady") == NULL)
    *steady = sample;
}

/* "deps": {PATH: HEX, ...}: the pins of a native candidate's dependencies. */
static int parse_deps(const cJSON *d, const char *path, ust__cand_config *cc) {
  if (!cJSON_IsObject(d))
    return ust__error(UST_ECONFIG, "config: '%s.deps' must be an object mapping library paths to their SHA-256", path);
  const int n = cJSON_GetArraySize(d);
  if (n > UST__MAX_DEPS)
    return ust__error(UST_ECONFIG, "config: '%s.deps' pins %d libraries; at most %d", path, n, UST__MAX_DEPS);
  for (const cJSON *it = d->child; it != NULL; it = it->next) {
    char pin[65];
    if (it->string[0] != '/' || !cJSON_IsString(it) || ust__sha256_pin_parse(it->valuestring, pin) != 0)
      return ust__error(UST_ECONFIG, "config: '%s.deps.%s' must map an absolute path to its 64 hex digit SHA-256",
                        path, it->string);
    char *p = ust__strdup(it->string);
    if (p == NULL)
      return ust__error(UST_ENOMEM, "config: out of memory");
    cc->dep_path[cc->n_deps] = p;
    memcpy(cc->dep_sha256[cc->n_deps++], pin, sizeof pin);
  }
  return 0;
}

/* "source": an object, kept as JSON text for the report; its "label" a
 * string when present. */
static int parse_source(const cJSON *c, const char *path, ust__cand_config *cc) {
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(c, "source");
  if (src == NULL)
    return 0;
  const cJSON *label = cJSON_GetObjectItemCaseSensitive(src, "label");
  if (!cJSON_IsObject(src) || (label != NULL && !cJSON_IsString(label)))
    return ust__error(UST_ECONFIG, "config: '%s.source' must be an object (its 'label' a string)", path);
  free(cc->source);
  if ((cc->source = cJSON_PrintUnformatted(src)) == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  if (strlen(cc->source) > 16384)
    return ust__error(UST_ECONFIG, "config: '%s.source' is %zu bytes as JSON; at most 16384", path,
                      strlen(cc->source));
  return 0;
}

/* "when": {DIM: integer, ...}: the key dimensions a route must have. The
 * names are checked against the operator's definition when it is bound. */
static int parse_when(const cJSON *c, const char *path, ust__cand_config *cc) {
  const cJSON *w = cJSON_GetObjectItemCaseSensitive(c, "when");
  if (w == NULL)
    return 0;
  if (!cJSON_IsObject(w) || cJSON_GetArraySize(w) > UST__MAX_WHEN)
    return ust__error(UST_ECONFIG, "config: '%s.when' must be an object of at most %d key dimensions and their "
                      "values", path, UST__MAX_WHEN);
  cc->n_when = 0;
  for (const cJSON *it = w->child; it != NULL; it = it->next) {
    if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int64_t)it->valuedouble ||
        ust__copy_name(cc->when_dim[cc->n_when], UST__NAME_MAX, it->string) != 0)
      return ust__error(UST_ECONFIG, "config: '%s.when.%s' must be a whole number (a key dimension's value)", path,
                        it->string);
    cc->when_value[cc->n_when++] = (int64_t)it->valuedouble;
  }
  return 0;
}

/* "candidate": {"native": PATH, "sha256": HEX, "deps": {...}, "target": OP} or
 * {"torch_op": "ns::name", "target": OP}. */
static int parse_candidate(const cJSON *c, const char *path, ust__cand_config *cc) {
  int rc = section(c, path, SEC_CANDIDATE);
  if (rc == 0)
    rc = fields_default(SEC_CANDIDATE, cc);
  if (rc != 0)
    return rc;
  const cJSON *qualify = cJSON_GetObjectItemCaseSensitive(c, "qualify");
  if (qualify != NULL) {
    if (!cJSON_IsString(qualify) || (strcmp(qualify->valuestring, "process") != 0 &&
                                     strcmp(qualify->valuestring, "here") != 0))
      return ust__error(UST_ECONFIG, "config: '%s.qualify' must be \"process\" (the candidate qualifies in a process "
                        "of its own before this one loads it) or \"here\"", path);
    if (strcmp(qualify->valuestring, "process") == 0) {
      const cJSON *top = cJSON_GetObjectItemCaseSensitive(c, "torch_op");
      if (cJSON_IsString(top) && strstr(top->valuestring, "::") != NULL &&
          strchr(strstr(top->valuestring, "::") + 2, '.') != NULL)
        return ust__error(UST_ECONFIG, "config: '%s.qualify' is \"process\" for torch op '%s': name the op without "
                          "an overload (its overload 'qualify' runs it in a process of its own)", path,
                          top->valuestring);
      cc->qualify = UST__QUALIFY_PROCESS;
    }
  }
  static const char *const process_only[] = {"qualify_calls", "qualify_memory_mb", "qualify_cpu_s"};
  for (size_t i = 0; i < sizeof process_only / sizeof process_only[0]; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, process_only[i]);
    if (v == NULL)
      continue;
    const ust__config_field *f = field_find(SEC_CANDIDATE, process_only[i]);
    if (cc->qualify != UST__QUALIFY_PROCESS)
      return ust__error(UST_ECONFIG, "config: '%s.%s' applies only with \"qualify\": \"process\"", path,
                        process_only[i]);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= f->lo && v->valuedouble <= f->hi) ||
        v->valuedouble != (double)(int)v->valuedouble)
      return ust__error(UST_ECONFIG, "config: '%s.%s' must be %s from %.0f to %.0f", path, process_only[i], f->what,
                        f->lo, f->hi);
    *(int *)((char *)cc + f->offset) = (int)v->valuedouble;
  }
  if ((rc = parse_source(c, path, cc)) != 0 || (rc = parse_when(c, path, cc)) != 0)
    return rc;
  const cJSON *deps = cJSON_GetObjectItemCaseSensitive(c, "deps");
  if (deps != NULL && cJSON_GetObjectItemCaseSensitive(c, "native") == NULL)
    return ust__error(UST_ECONFIG, "config: '%s.deps' applies to native candidates only", path);
  if (deps != NULL && (rc = parse_deps(deps, path, cc)) != 0)
    return rc;
  const cJSON *native = cJSON_GetObjectItemCaseSensitive(c, "native");
  const cJSON *sha = cJSON_GetObjectItemCaseSensitive(c, "sha256");
  const cJSON *top = cJSON_GetObjectItemCaseSensitive(c, "torch_op");
  const cJSON *target = cJSON_GetObjectItemCaseSensitive(c, "target");
  char sub[UST__NAME_MAX + 64];
  if ((native == NULL) == (top == NULL))
    return ust__error(UST_ECONFIG, "config: '%s' needs exactly one of 'native' (a shared object) or 'torch_op'", path);
  if (native != NULL) {
    cc->kind = UST__CAND_NATIVE;
    snprintf(sub, sizeof sub, "%s.native", path);
    if ((rc = parse_string(native, sub, &cc->path)) != 0)
      return rc;
    if (sha == NULL || !cJSON_IsString(sha) || ust__sha256_pin_parse(sha->valuestring, cc->sha256) != 0)
      return ust__error(UST_ECONFIG,
                        "config: '%s.sha256' must be the 64 hex digits of the shared object's SHA-256 "
                        "(a native candidate is loaded only when it matches)", path);
  } else {
    cc->kind = UST__CAND_TORCH_OP;
    if (sha != NULL)
      return ust__error(UST_ECONFIG, "config: '%s.sha256' applies to native candidates only", path);
    if (!cJSON_IsString(top) || strstr(top->valuestring, "::") == NULL ||
        ust__copy_name(cc->torch_op, sizeof cc->torch_op, top->valuestring) != 0)
      return ust__error(UST_ECONFIG, "config: '%s.torch_op' must be a dispatcher op name like \"ns::name\"", path);
  }
  if (target != NULL && (!cJSON_IsString(target) || strstr(target->valuestring, "::") == NULL ||
                         ust__copy_name(cc->target, sizeof cc->target, target->valuestring) != 0))
    return ust__error(UST_ECONFIG, "config: '%s.target' must be a bound dispatcher op like \"aten::mm\"", path);
  return 0;
}

/* "guard": the comparison's kind by hand (the guard's own names, its
 * message), the rest through the table. */
static int guard_field(const ust__config_field *f, const cJSON *v, const char *path, void *ctx) {
  ust__op_config *oc = ctx;
  if (strcmp(f->name, "compare") != 0)
    return no_hand(path);
  if (!cJSON_IsString(v) || (oc->compare = ust__cmp_kind_parse(v->valuestring)) < 0)
    return ust__error(UST_ECONFIG, "config: '%s' must be \"allclose\", \"exact\" or \"set\"", path);
  return 0;
}

/* "routes": {KEY: MODE or {"mode": MODE, "canary": P}}: modes of single
 * shape keys, as the report spells them. */
static int parse_routes(const cJSON *v, const char *path, ust__op_config *oc) {
  if (!cJSON_IsObject(v))
    return ust__error(UST_ECONFIG, "config: '%s' must be an object mapping shape keys to modes", path);
  int n = cJSON_GetArraySize(v);
  oc->routes = calloc(n > 0 ? (size_t)n : 1, sizeof *oc->routes);
  if (oc->routes == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  for (const cJSON *it = v->child; it != NULL; it = it->next) {
    ust__route_config *rc_ = &oc->routes[oc->n_routes];
    char sub[UST__NAME_MAX + 600];
    snprintf(sub, sizeof sub, "%s.%s", path, it->string);
    if (ust__copy_name(rc_->key, sizeof rc_->key, it->string) != 0 || strchr(it->string, '|') == NULL)
      return ust__error(UST_ECONFIG, "config: '%s' is not a shape key like \"aten::mm|cuda|bf16,bf16|M=8,K=64,N=64\"",
                        sub);
    rc_->canary = -1;
    int rc;
    if (cJSON_IsString(it)) {
      rc = parse_mode(it, sub, &rc_->mode);
    } else {
      rc = section(it, sub, SEC_ROUTE);
      if (rc == 0 && cJSON_GetObjectItemCaseSensitive(it, "mode") == NULL)
        rc = ust__error(UST_ECONFIG, "config: '%s' needs a 'mode'", sub);
      if (rc == 0)
        rc = fields_parse(SEC_ROUTE, it, sub, rc_, NULL, NULL);
    }
    if (rc != 0)
      return rc;
    oc->n_routes++;
  }
  return 0;
}

/* The fields of an operator's object that depend on others or hold
 * objects of their own. */
static int operator_field(const ust__config_field *f, const cJSON *v, const char *path, void *ctx) {
  ust__op_config *oc = ctx;
  if (strcmp(f->name, "sample_steady") == 0)
    return parse_steady(f, v, path, oc, oc->sample);
  if (strcmp(f->name, "candidate") == 0)
    return parse_candidate(v, path, &oc->cand);
  if (strcmp(f->name, "guard") == 0) {
    int rc = section(v, path, SEC_GUARD);
    return rc != 0 ? rc : fields_parse(SEC_GUARD, v, path, oc, guard_field, oc);
  }
  if (strcmp(f->name, "promotion") == 0) {
    oc->promotion.enabled = 1;
    int rc = section(v, path, SEC_PROMOTION);
    return rc != 0 ? rc : fields_parse(SEC_PROMOTION, v, path, &oc->promotion, NULL, NULL);
  }
  if (strcmp(f->name, "routes") == 0)
    return parse_routes(v, path, oc);
  return no_hand(path);
}

/* An operator given as an object. */
static int parse_operator(const cJSON *it, const char *path, ust__op_config *oc) {
  int rc = check_keys(it, path, SEC_OP);
  if (rc == 0)
    rc = fields_parse(SEC_OP, it, path, oc, operator_field, oc);
  steady_follows_sample(it, oc->sample, &oc->sample_steady);
  return rc;
}

/* An operator's entry that is neither a mode nor an object: the error
 * names every field an object may hold. */
static int not_an_operator(const char *path) {
  char list[256];
  section_keys(SEC_OP, list, sizeof list);
  return ust__error(UST_ECONFIG, "config: '%s' must be a mode string or an object {%s}", path, list);
}

/* More operators than any definitions directory holds: refused before
 * anything is allocated for them. */
#define UST__MAX_CONFIG_OPS 4096

/* Operator names seen so far: a duplicate is found in constant time. */
typedef struct name_seen {
  char name[UST__NAME_MAX];
  UT_hash_handle hh;
} name_seen;

static int parse_operators_seen(const cJSON *ops, ust__config *cfg, name_seen **seen, name_seen *marks);

static int parse_operators(const cJSON *ops, ust__config *cfg) {
  if (!cJSON_IsObject(ops))
    return ust__error(UST_ECONFIG, "config: 'operators' must be an object mapping operator names to settings");
  int n = cJSON_GetArraySize(ops);
  if (n > UST__MAX_CONFIG_OPS)
    return ust__error(UST_ECONFIG, "config: 'operators' lists %d operators; at most %d are read", n,
                      UST__MAX_CONFIG_OPS);
  name_seen *seen = NULL, *marks = calloc(n > 0 ? (size_t)n : 1, sizeof *marks);
  if (marks == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  int rc = parse_operators_seen(ops, cfg, &seen, marks);
  HASH_CLEAR(hh, seen);
  free(marks);
  return rc;
}

static int parse_operators_seen(const cJSON *ops, ust__config *cfg, name_seen **seen, name_seen *marks) {
  /* what an operator starts from: the config's defaults and the table's */
  ust__op_config start;
  memset(&start, 0, sizeof start);
  start.mode = cfg->default_mode;
  start.sample = cfg->default_sample;
  start.sample_steady = cfg->default_sample_steady;
  start.steady_after = cfg->steady_after;
  start.compare = -1;
  start.atol = start.rtol = -1;
  int rc = fields_default(SEC_OP, &start);
  if (rc == 0)
    rc = fields_default(SEC_GUARD, &start);
  if (rc == 0)
    rc = fields_default(SEC_PROMOTION, &start.promotion);
  if (rc != 0)
    return rc;
  int n = cJSON_GetArraySize(ops);
  cfg->ops = calloc(n > 0 ? (size_t)n : 1, sizeof *cfg->ops);
  if (cfg->ops == NULL)
    return ust__error(UST_ENOMEM, "config: out of memory");
  for (const cJSON *it = ops->child; it != NULL; it = it->next) {
    char path[UST__NAME_MAX + 32];
    snprintf(path, sizeof path, "operators.%s", it->string);
    ust__op_config *oc = &cfg->ops[cfg->n_ops];
    *oc = start;
    if (ust__copy_name(oc->name, sizeof oc->name, it->string) != 0 || it->string[0] == '\0')
      return ust__error(UST_ECONFIG, "config: operator name '%s' is empty or too long", it->string);
    name_seen *dup = NULL;
    HASH_FIND_STR(*seen, oc->name, dup);
    if (dup != NULL)
      return ust__error(UST_ECONFIG, "config: '%s' appears twice", path);
    name_seen *mark = &marks[cfg->n_ops];
    snprintf(mark->name, sizeof mark->name, "%s", oc->name);
    ust__hash_oom = 0;
    HASH_ADD_STR(*seen, name, mark);
    if (ust__hash_oom)
      return ust__error(UST_ENOMEM, "config: out of memory");
    if (cJSON_IsString(it))
      rc = parse_mode(it, path, &oc->mode);
    else if (cJSON_IsObject(it))
      rc = parse_operator(it, path, oc);
    else
      rc = not_an_operator(path);
    if (rc == 0 && oc->mode >= UST__MODE_SHADOW && oc->cand.kind == 0)
      rc = ust__error(UST_ECONFIG, "config: '%s' is in mode %s but names no 'candidate'", path,
                      ust__mode_name(oc->mode));
    for (int k = 0; rc == 0 && k < oc->n_routes; k++)
      if (oc->routes[k].mode >= UST__MODE_SHADOW && oc->cand.kind == 0)
        rc = ust__error(UST_ECONFIG, "config: '%s.routes.%s' is in mode %s but the operator names no 'candidate'",
                        path, oc->routes[k].key, ust__mode_name(oc->routes[k].mode));
    if (rc == 0 && oc->promotion.enabled && oc->cand.kind == 0)
      rc = ust__error(UST_ECONFIG, "config: '%s.promotion' needs a 'candidate' to promote", path);
    if (rc != 0) {
      cfg->n_ops++; /* so that config_free releases what this entry owns */
      return rc;
    }
    cfg->n_ops++;
  }
  return 0;
}

/* "metrics": {port, host, top_keys, model_name, engine}. The Python package acts on it (an endpoint
 * of its own, or the host's Prometheus registry); the core only checks it, so
 * that a mistake is refused at enable like any other field. The host by hand:
 * it needs the port. */
static int metrics_field(const ust__config_field *f, const cJSON *v, const char *path, void *ctx) {
  const cJSON *m = ctx;
  if (strcmp(f->name, "host") != 0)
    return no_hand(path);
  if (!cJSON_IsString(v) || v->valuestring[0] == '\0' || strlen(v->valuestring) > 255)
    return ust__error(UST_ECONFIG, "config: 'metrics.host' must be a non-empty string of at most 255 "
                                   "characters (the address the endpoint binds, e.g. \"127.0.0.1\")");
  if (cJSON_GetObjectItemCaseSensitive(m, "port") == NULL)
    return ust__error(UST_ECONFIG, "config: 'metrics.host' needs 'metrics.port' (the host is where the "
                                   "stand-alone endpoint binds)");
  return 0;
}

/* "defaults": its mode and sample_steady by hand, each checked against
 * another field. */
static int defaults_field(const ust__config_field *f, const cJSON *v, const char *path, void *ctx) {
  ust__config *cfg = ctx;
  if (strcmp(f->name, "sample_steady") == 0)
    return parse_steady(f, v, path, cfg, cfg->default_sample);
  if (strcmp(f->name, "mode") != 0)
    return no_hand(path);
  int rc = field_parse(f, v, path, cfg);
  if (rc == 0 && cfg->default_mode >= UST__MODE_SHADOW)
    rc = ust__error(UST_ECONFIG, "config: 'defaults.mode' cannot be %s: it needs a candidate, named per "
                                 "operator in 'operators.NAME.candidate'", ust__mode_name(cfg->default_mode));
  return rc;
}

static int parse_root(const cJSON *root, ust__config *cfg) {
  if (!cJSON_IsObject(root))
    return ust__error(UST_ECONFIG, "config: the top level must be a JSON object");
  int rc = check_keys(root, "", "");
  if (rc == 0)
    rc = fields_parse("", root, "", cfg, NULL, NULL); /* the sections below, in the order they depend on */
  const cJSON *v;
  if (rc == 0)
    rc = section_parse(root, "report", cfg, NULL, NULL, &v);
  if (rc == 0)
    rc = section_parse(root, "hardware", cfg, NULL, NULL, &v);
  if (rc == 0 && (rc = section_parse(root, "state", cfg, NULL, NULL, &v)) == 0 && v != NULL &&
      cJSON_GetObjectItemCaseSensitive(v, "path") == NULL)
    rc = ust__error(UST_ECONFIG, "config: 'state' needs a 'path' (the file the rollout state is kept in)");
  if (rc == 0)
    rc = section_parse(root, "shadow", cfg, NULL, NULL, &v);
  if (rc == 0)
    rc = section_parse(root, "timer", cfg, NULL, NULL, &v);
  if (rc != 0)
    return rc;
  /* CUPTI's kernel tracing fails every launch of a graph that holds a
   * kernel able to launch graphs from the device ("unspecified launch
   * failure", the context lost; CUDA 13.0 on an H200, torch's profiler) */
  if (cfg->shadow_graph_beside_launch && cfg->timer_kind != UST__TIMER_EVENTS)
    return ust__error(UST_ECONFIG, "config: 'shadow.graph_beside_launch' device needs 'timer.kind' events: CUPTI's "
                                   "kernel tracing fails graphs whose kernels launch graphs from the device");
  if ((rc = section_parse(root, "defaults", cfg, defaults_field, cfg, &v)) != 0)
    return rc;
  if (v != NULL)
    steady_follows_sample(v, cfg->default_sample, &cfg->default_sample_steady);
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "metrics");
  if ((rc = section_parse(root, "metrics", NULL, metrics_field, (void *)m, &v)) != 0)
    return rc;
  const cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "operators");
  cfg->all_operators = ops == NULL;
  if (ops != NULL && (rc = parse_operators(ops, cfg)) != 0)
    return rc;
  return 0;
}

int ust__config_parse(const char *json, ust__config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->all_operators = 1;
  /* the table's defaults, for the top level and the sections kept in cfg */
  int rc = fields_default("", cfg);
  for (size_t i = 0; rc == 0 && i < sizeof fields / sizeof fields[0]; i++)
    if (fields[i].section[0] == '\0' && fields[i].type == UST__FIELD_OBJECT)
      rc = fields_default(fields[i].name, cfg);
  if (rc != 0) {
    ust__config_free(cfg);
    return rc;
  }
  if (json == NULL || json[0] == '\0')
    return 0;
  cJSON *root = ust__json_parse(json, "config", UST_ECONFIG);
  if (root == NULL) {
    ust__config_free(cfg);
    return UST_ECONFIG;
  }
  rc = parse_root(root, cfg);
  cJSON_Delete(root);
  /* modes given to single shape keys are routes: no more than max_routes
   * of them (each a row of the rollout table and the state file) */
  long n_routes = 0;
  for (int i = 0; rc == 0 && i < cfg->n_ops; i++)
    n_routes += cfg->ops[i].n_routes;
  if (rc == 0 && n_routes > cfg->max_routes)
    rc = ust__error(UST_ECONFIG, "config: %ld shape keys under the operators' 'routes', more than 'max_routes' (%d)",
                    n_routes, cfg->max_routes);
  if (rc != 0) {
    ust__config_free(cfg);
    return rc;
  }
  return 0;
}

void ust__config_free(ust__config *cfg) {
  if (cfg == NULL)
    return;
  free(cfg->problems_dir);
  free(cfg->report_path);
  free(cfg->hardware_dir);
  free(cfg->hardware_profile);
  free(cfg->state_path);
  free(cfg->cupti_path);
  cfg->hardware_dir = cfg->hardware_profile = cfg->state_path = cfg->cupti_path = NULL;
  for (int i = 0; cfg->ops != NULL && i < cfg->n_ops; i++) {
    free(cfg->ops[i].cand.path);
    free(cfg->ops[i].cand.source);
    for (int k = 0; k < cfg->ops[i].cand.n_deps; k++)
      free(cfg->ops[i].cand.dep_path[k]);
    free(cfg->ops[i].routes);
  }
  free(cfg->ops);
  cfg->problems_dir = cfg->report_path = NULL;
  cfg->ops = NULL;
  cfg->n_ops = 0;
}

/* The config as JSON with the fields a reload may change taken out (an
 * operator given as a mode string becomes an empty object). */
static cJSON *config_fixed_part(const char *json) {
  cJSON *root = ust__json_parse(json != NULL && json[0] ? json : "{}", "reload", UST_ECONFIG);
  if (root == NULL)
    return NULL;
  cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "operators");
  if (!cJSON_IsObject(ops))
    return root; /* nothing reloadable in it: compared whole */
  for (cJSON *it = ops->child, *next; it != NULL; it = next) {
    next = it->next; /* replacing it frees it */
    if (cJSON_IsString(it)) {
      cJSON_ReplaceItemInObjectCaseSensitive(ops, it->string, cJSON_CreateObject());
      continue;
    }
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
      if ((fields[k].flags & UST__FIELD_RELOADABLE) && strcmp(fields[k].section, SEC_OP) == 0)
        cJSON_DeleteItemFromObjectCaseSensitive(it, fields[k].name);
  }
  return root;
}

/* The path of the first difference between two JSON values, into path. */
static int first_difference(const cJSON *a, const cJSON *b, char *path, size_t cap) {
  if (cJSON_Compare(a, b, 1))
    return 0;
  if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
    const cJSON *sides[2][2] = {{a, b}, {b, a}};
    for (int s = 0; s < 2; s++)
      for (const cJSON *x = sides[s][0]->child; x != NULL; x = x->next) {
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(sides[s][1], x->string);
        size_t n = strlen(path);
        snprintf(path + n, cap - n, "%s%s", n ? "." : "", x->string);
        if (y == NULL || first_difference(s == 0 ? x : y, s == 0 ? y : x, path, cap))
          return 1;
        path[n] = '\0';
      }
  }
  return 1;
}

int ust__config_reload_check(const char *running, const char *next) {
  cJSON *was = config_fixed_part(running), *now = was != NULL ? config_fixed_part(next) : NULL;
  char path[256] = "";
  int rc = 0;
  if (was == NULL || now == NULL)
    rc = UST_ECONFIG; /* the parser said why */
  else if (first_difference(was, now, path, sizeof path))
    rc = ust__error(UST_ECONFIG, "reload: '%s' differs from the running config; a reload changes only operators' "
                    "mode, canary, strict, promotion and routes", path[0] ? path : "(top level)");
  cJSON_Delete(was);
  cJSON_Delete(now);
  return rc;
}
