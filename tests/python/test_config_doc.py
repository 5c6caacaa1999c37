"""docs/configuration.md is written from the config parser's field table
(plugin/config.c) by ust_config_doc: the committed page must be what it
writes, and the keys it lists for each object are the keys the library
accepts there, so that the page cannot drift from the parser."""
import difflib
import re
import subprocess

import pytest

import understudy
from conftest import ROOT, need

PAGE = ROOT / "docs" / "configuration.md"
REGENERATE = "cmake --build build --target config_doc"
KEY = "aten::mm|cpu|f32,f32|M=1,K=1,N=1"


def generator():
    """ust_config_doc of the build the library comes from (a sanitized build
    has its own), else of the clone's build; None when neither has one."""
    for d in (understudy.library_path().parent, ROOT / "build"):
        if (d / "ust_config_doc").is_file():
            return d / "ust_config_doc"
    return None


def page_tables():
    """{JSON path of an object: {key: the cells of its row}}, in the page's
    order, from the page's headings and the table under each."""
    tables, current = {}, None
    for line in PAGE.read_text().splitlines():
        heading = re.fullmatch(r"## (?:`([^`]+)`|The top level)", line)
        if heading:
            current = heading.group(1) or ""
            tables[current] = {}
        elif current is not None and (row := re.match(r"\| `([^`]+)`", line)):
            tables[current][row.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
    return tables


def test_configuration_page_is_what_the_field_table_writes():
    gen = generator()
    need(gen is not None, "ust_config_doc is not built: cmake --build build --target ust_config_doc")
    p = subprocess.run([str(gen)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    committed = PAGE.read_text()
    if p.stdout != committed:
        diff = "".join(difflib.unified_diff(committed.splitlines(True), p.stdout.splitlines(True),
                                            "docs/configuration.md", "what the field table writes", n=1))
        pytest.fail(f"docs/configuration.md is not what the config parser's field table (plugin/config.c) "
                    f"writes: regenerate it with `{REGENERATE}` and commit it.\n{diff[:6000]}", pytrace=False)


def test_configuration_page_says_how_it_is_made_and_stays_short():
    lines = PAGE.read_text().splitlines()
    assert lines[0].startswith("<!-- Generated") and "do not edit" in lines[0]
    assert REGENERATE in lines[1] and lines[1].endswith("-->")
    assert len(lines) <= 400


@pytest.mark.parametrize("section", sorted(page_tables()))
def test_each_object_on_the_page_has_the_keys_the_library_accepts(us, section):
    """A key the page does not list is refused by the library, which names
    the page's keys of that object, in the page's order."""
    names = list(page_tables()[section])
    path = section.replace("<name>", "gemm").replace("<key>", KEY)
    config = node = {}
    for part in path.split(".") if path else []:
        node = node.setdefault(part, {})
    node["not_a_field"] = 1
    with pytest.raises(understudy.ConfigError) as e:
        us.enable(config)
    where = f"{path}.not_a_field" if path else "not_a_field"
    assert str(e.value) == f"config: unknown field '{where}' (expected one of: {', '.join(names)})"
    assert not us.is_enabled()


def test_metrics_defaults_on_the_page_are_the_python_packages():
    """The core only checks the metrics section; the package acts on it, so
    the defaults the page gives there are the package's."""
    from understudy import metrics
    rows = page_tables()["metrics"]
    assert rows["top_keys"][2] == f"`{metrics.DEFAULT_TOP_KEYS}`"
    assert rows["host"][2] == f"`{metrics.DEFAULT_HOST}`"
