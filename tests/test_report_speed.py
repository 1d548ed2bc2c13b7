"""What keeps ``meshplan report`` quick (issue 83) without changing its page: the templates' compiled code kept in
the user's cache directory, and the scaling searches run beside the report's own (forked where cores are idle) giving
the rows that one process gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshplan.cli import main

pytest.importorskip("jinja2")
pytest.importorskip("vl_convert")

from meshplan.report import vega  # noqa: E402


@pytest.fixture
def fresh_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    vega.environment.cache_clear()
    yield tmp_path / "cache" / "meshplan" / "templates"
    vega.environment.cache_clear()  # the next test's environment reads the cache it sets


def test_templates_compiled_once_then_loaded(fresh_environment):
    first = vega.environment().get_template("report.html.j2")
    kept = sorted(fresh_environment.iterdir())
    assert kept and all(p.suffix == ".cache" for p in kept)
    vega.environment.cache_clear()
    env = vega.environment()
    compiled = []
    env.compile = lambda *a, **k: compiled.append(a) or pytest.fail("compiled again")  # type: ignore[method-assign]
    again = env.get_template("report.html.j2")
    assert not compiled and again.render is not None and first.name == again.name


def test_templates_without_a_writable_cache(fresh_environment):
    fresh_environment.parent.mkdir(parents=True)
    fresh_environment.write_text("a file where the directory would go")  # the directory cannot be made
    assert vega.environment().get_template("report.html.j2").name == "report.html.j2"


def _page(path: Path) -> str:
    return re.sub(r"search took [0-9.]+ s", "", path.read_text())


def test_scaling_rows_forked_or_not_give_one_page(tmp_path, capsys, monkeypatch):
    from meshplan.search import workers

    args = ["report", "--model", "gpt2", "--system", "h100", "--gpus", "16", "--global-batch", "64", "--placements",
            "default", "--no-offload", "--scaling", "8,16,32", "--sample", "300"]
    assert main([*args, "--workers", "1", "-o", str(tmp_path / "one.html")]) == 0, capsys.readouterr().err
    monkeypatch.setattr(workers, "idle_cores", lambda: 2)  # the default: forked where two cores are idle
    assert main([*args, "-o", str(tmp_path / "forked.html")]) == 0, capsys.readouterr().err
    monkeypatch.setattr(workers, "idle_cores", lambda: 0)  # ... in this process where none is
    assert main([*args, "-o", str(tmp_path / "here.html")]) == 0, capsys.readouterr().err
    one = _page(tmp_path / "one.html")
    assert "scaling" in one and _page(tmp_path / "forked.html") == one == _page(tmp_path / "here.html")
