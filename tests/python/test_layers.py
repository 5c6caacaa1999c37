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
