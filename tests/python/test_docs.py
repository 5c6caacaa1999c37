"""The docs stay what a reader can use: a README for newcomers (at most 300
lines), one page per topic in docs/ (at most 400 lines each), no commit hashes
(history belongs in git, CHANGELOG.md and benchmarks/results/), links that
lead somewhere, the README's test command the one CI runs, and a performance
page that is exactly what benchmarks/render_performance.py renders from
benchmarks/results/ (regenerated, never edited by hand).

Standard library and pytest only: no build, no torch, no GPU needed.
"""
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX, PAGE_MAX = 300, 400

# A commit-like word: 7 to 40 hex digits with a letter among them (the rule
# the repository's review hook applies), or 7 digits and more in a row, which
# is a hash too where it has no letter (write 1,000,000 for a number).
HASH = re.compile(r"\b[0-9a-f]{7,40}\b")
DIGITS = re.compile(r"(?<![.,])\b[0-9]{7,}\b")  # not a decimal fraction's digits
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def pages():
    return sorted(DOCS.glob("*.md"))


def texts():
    return [README, *pages()]


def renderer():
    spec = importlib.util.spec_from_file_location("render_performance", ROOT / "benchmarks" / "render_performance.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lines(path):
    return path.read_text().count("\n")


def test_the_readme_is_short():
    assert lines(README) <= README_MAX, f"README.md has {lines(README)} lines, more than {README_MAX}: reference " \
                                        "belongs in docs/, figures in benchmarks/results/"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_each_docs_page_is_one_topic_of_bounded_length(page):
    assert lines(page) <= PAGE_MAX, f"{page.relative_to(ROOT)} has {lines(page)} lines, more than {PAGE_MAX}: " \
                                    "split it by topic"


def commit_like(text):
    """The words of text a reader would take for a commit."""
    return sorted({m for m in HASH.findall(text) if re.search("[a-f]", m)} | set(DIGITS.findall(text)))


def test_commit_like_words_are_found():
    assert commit_like("at 4ac8133, measured") == ["4ac8133"]
    assert commit_like("see 1234567 and 1,234,567") == ["1234567"]
    assert commit_like("a 2048 mm, a decade, 123456 calls, cafe") == []
    assert commit_like("a share of 0.00390625") == []


@pytest.mark.parametrize("path", texts(), ids=lambda p: p.name)
def test_no_commit_hash_in_the_docs(path):
    found = commit_like(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} cites {found}: history belongs in git, CHANGELOG.md and " \
                      "benchmarks/results/, not in the docs"


def test_the_readme_holds_the_test_command_ci_runs():
    commands = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
                if ln.strip() and not ln.strip().startswith(("#", "set ", "cd ", "export "))]
    assert commands, ".ci/run runs no command"
    readme = README.read_text()
    # whole: "./run.sh test" is not shown by "./run.sh tests" or "./run.sh test-gpu"
    missing = [c for c in commands if not re.search(re.escape(c) + r"(?![\w-])", readme)]
    assert not missing, f"README.md does not show the command{'s' * (len(missing) > 1)} .ci/run runs: {missing}"


def slug(heading):
    """The anchor GitHub makes of a heading: lower case, punctuation but
    hyphens and underscores dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    body = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.*)$", body, flags=re.M)}


def links(path):
    """Relative links of a Markdown file, outside code blocks and spans."""
    body = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    body = re.sub(r"`[^`\n]*`", "", body)
    return [t for t in LINK.findall(body) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("path", texts(), ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(path):
    broken = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        # docs/configuration.md is generated from the config parser's own field
        # table by another program, whose test checks that page; it may not be
        # in this tree yet, so links to it are not followed here.
        if file and dest == DOCS / "configuration.md":
            continue
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} links to what does not exist: {broken}"


def test_the_link_check_sees_links_and_anchors():
    assert slug("The kernel tracer (`\"timer\": {\"kind\": \"cupti\"}`)") == "the-kernel-tracer-timer-kind-cupti"
    assert slug("Typed and boxed interceptors") == "typed-and-boxed-interceptors"
    assert slug("kernel_time") == "kernel_time"
    assert "graph-replays" in anchors(DOCS / "timing.md")


def test_the_performance_page_and_the_readme_table_are_as_rendered():
    r = renderer()
    out = r.rendered(r.load(), README.read_text())
    stale = [str(p.relative_to(ROOT)) for p, text in out.items() if not p.exists() or p.read_text() != text]
    assert not stale, f"{stale} differ from what benchmarks/results/ renders: run " \
                      "python3 benchmarks/render_performance.py (never edit docs/performance.md by hand)"


def test_results_files_are_what_the_renderer_reads():
    r = renderer()
    results = r.load()
    assert results, "benchmarks/results/ holds no results"
    for name, rec in results:
        assert re.fullmatch(r"[a-z0-9_]+-\d{8}T\d{6}Z(-\d+)?\.json", name), name
        assert name.startswith(rec["benchmark"] + "-"), name
        assert rec["date"].replace("-", "").replace(":", "")[:16] == name[len(rec["benchmark"]) + 1:][:16], name
    assert r.headline(results) is not None, "no GPU run of the README's overhead table in benchmarks/results/"


def test_a_results_file_names_the_commit_it_is_told_of(monkeypatch):
    """A tree copied to another machine may carry git metadata not its own:
    UNDERSTUDY_BENCH_COMMIT names the commit, and whether the tree was
    dirty is then not known."""
    spec = importlib.util.spec_from_file_location("_results", ROOT / "benchmarks" / "_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.delenv("UNDERSTUDY_BENCH_COMMIT", raising=False)
    own = mod.commit()
    assert own["commit"] is None or re.fullmatch(r"[0-9a-f]{7,40}", own["commit"])
    monkeypatch.setenv("UNDERSTUDY_BENCH_COMMIT", "abc1234")
    assert mod.commit() == {"commit": "abc1234", "dirty": None}
