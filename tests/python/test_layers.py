"""The house's layers, read from the sources: base/ <- scorer/ <- guard/ <-
dispatch/ <- plugin/. An include never runs from a lower folder to a higher
one, no two files include each other (directly or in a circle), and no file
calls a function that only a higher folder defines."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = ["base", "scorer", "guard", "dispatch", "plugin"]
RANK = {name: i for i, name in enumerate(LAYERS)}
SOURCES = [p for d in LAYERS if (ROOT / d).is_dir() for p in sorted((ROOT / d).iterdir())
           if p.suffix in (".c", ".h", ".cpp", ".cu")]


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def includes(path):
    return re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), flags=re.M)


def rel(path):
    return path.relative_to(ROOT).as_posix()


def test_no_include_runs_upward():
    upward = []
    for src in SOURCES:
        mine = RANK[rel(src).split("/")[0]]
        for inc in includes(src):
            folder = inc.split("/")[0]
            if folder in RANK and RANK[folder] > mine:
                upward.append(f"{rel(src)} includes {inc}")
    assert upward == []


def test_no_circle_of_includes():
    graph = {rel(s): [i for i in includes(s) if (ROOT / i).exists()] for s in SOURCES}
    state, circles = {}, []

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_no_call_runs_upward():
    defined = {}
    for src in SOURCES:
        if src.suffix == ".h":
            continue
        for name in re.findall(r"^[A-Za-z_][\w \*]*?\b(ust_{1,2}\w+)\s*\([^;]*?\)\s*\{", strip_comments(src.read_text()),
                               flags=re.M):
            defined.setdefault(name, set()).add(RANK[rel(src).split("/")[0]])
    assert len(defined) > 100  # the scan reads the sources
    upward = []
    for src in SOURCES:
        mine = RANK[rel(src).split("/")[0]]
        used = set(re.findall(r"\b(ust_{1,2}\w+)\s*\(", strip_comments(src.read_text())))
        for name in used:
            layers = defined.get(name)
            if layers and min(layers) > mine:
                upward.append(f"{rel(src)} calls {name} ({LAYERS[min(layers)]}/)")
    assert upward == []


def test_no_circle_of_calls_between_files():
    """A file that calls into another never gets called back by it, directly
    or around a circle (the report and the engine, the router and the guard,
    once did)."""
    owner = {}
    for src in SOURCES:
        if src.suffix == ".h":
            continue
        for name in re.findall(r"^[A-Za-z_][\w \*]*?\b(ust_{1,2}\w+)\s*\([^;]*?\)\s*\{", strip_comments(src.read_text()),
                               flags=re.M):
            owner.setdefault(name, set()).add(rel(src))
    graph = {}
    for src in SOURCES:
        me = rel(src)
        used = set(re.findall(r"\b(ust_{1,2}\w+)\s*\(", strip_comments(src.read_text())))
        graph[me] = {next(iter(owner[n])) for n in used if len(owner.get(n, ())) == 1} - {me}
    state, circles = {}, []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


# ---- each part of a route written only by its owner --------------------------------
# A route is made of parts declared by their owners (dispatch/dispatch.h): its
# figures (scorer/), its verifications and its rollout (guard/). A field of a
# part is written only through its owner's functions; other folders read.
PART_OWNERS = {"figs": "scorer", "verify": "guard", "rollout": "guard", "flight": "guard"}
_PART = r"(?:->|\.)(figs|verify|rollout|flight)(?:\[[^\]]*\])?(?:->|\.)(\w+)"
ATOMIC_WRITE = re.compile(r"\b(?:atomic_(?:fetch_\w+?|store|exchange|compare_exchange_\w+?)(?:_explicit)?|__atomic_\w+)"
                          r"\s*\(\s*&\s*[\w\[\]()*]*?" + _PART)
PLAIN_WRITE = re.compile(_PART + r"(?:\[[^\]]*\])?\s*(?:\+\+|--|[-+*/|&^]?=(?!=))")


def direct_writes(text):
    text = strip_comments(text)
    return [m.group(1) + "." + m.group(2) for r in (ATOMIC_WRITE, PLAIN_WRITE) for m in r.finditer(text)]


def test_the_scan_sees_a_direct_write():
    assert direct_writes("atomic_fetch_add_explicit(&r->figs.calls, w, memory_order_relaxed);") == ["figs.calls"]
    assert direct_writes("atomic_store(&kn->figs[i]->unseen_ns, 0);") == ["figs.unseen_ns"]
    assert direct_writes("r->verify.overdue++;") == ["verify.overdue"]
    assert direct_writes("s->rollout.evidence = e;") == ["rollout.evidence"]
    assert direct_writes("x = atomic_load(&r->figs.calls); if (s->figs.calls == 1) {}") == []


def test_route_parts_are_written_by_their_owners_alone():
    found = []
    for src in SOURCES:
        folder = rel(src).split("/")[0]
        for w in direct_writes(src.read_text()):
            if PART_OWNERS[w.split(".")[0]] != folder:
                found.append(f"{rel(src)} writes {w}")
    assert found == []


# ---- sizes a reader can hold --------------------------------------------------------
SEAM_AND_ROUTER = [p for p in SOURCES if rel(p).startswith("dispatch/bridge") or
                   rel(p) in ("dispatch/route_key.h", "dispatch/routes.h", "dispatch/route_key.c", "dispatch/routes.c", "dispatch/admit.c",
                              "dispatch/plan.c", "dispatch/fallback.c", "dispatch/sink.c")]
FUNCTION_START = re.compile(r"^(\s{0,2})(?!(?:struct|class|enum|union|namespace|extern|typedef)\b)[A-Za-z_\[].*\)\s*"
                            r"(?:const\s*)?(?:noexcept\s*)?\{\s*$")


def functions(path):
    """(lines, name) of each function defined in path: a line at the margin (or
    a class's first indent) ending in '{', to the brace at its indent."""
    lines = path.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FUNCTION_START.match(lines[i])
        if m and "=" not in lines[i].split("(")[0]:
            end = m.group(1) + "}"
            j = i + 1
            while j < len(lines) and not (lines[j] == end or lines[j].startswith(end + ";")):
                j += 1
            out.append((j - i + 1, (re.findall(r"([\w:~]+)\s*\(", lines[i]) or ["?"])[0]))
            i = j
        i += 1
    return out


def test_the_seam_and_the_router_are_split_by_job():
    names = {rel(p) for p in SEAM_AND_ROUTER}
    assert {"dispatch/bridge_intercept.cpp", "dispatch/bridge_eager.cpp", "dispatch/bridge_captured.cpp",
            "dispatch/bridge_native.cpp", "dispatch/plan.c", "dispatch/admit.c", "dispatch/sink.c"} <= names
    long_files = [f"{rel(p)}: {n}" for p in SEAM_AND_ROUTER if (n := len(p.read_text().split("\n"))) > 900]
    long_functions = [f"{rel(p)}: {name} {n}" for p in SEAM_AND_ROUTER for n, name in functions(p) if n > 150]
    assert long_files == [] and long_functions == []
    assert max(n for p in SEAM_AND_ROUTER for n, _ in functions(p)) > 20  # the scan finds functions


def test_no_core_file_is_over_1500_lines():
    assert [f"{rel(p)}: {n}" for p in SOURCES if (n := len(p.read_text().split("\n"))) > 1500] == []
