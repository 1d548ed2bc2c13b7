"""The charts' runtime, embedded: Vega, Vega-Lite and vega-embed as one script, from ``vl-convert-python`` (the Vega
project's own converter, which ships the three libraries and bundles them offline), and the page's templates
(Jinja2, packaged under report/templates, autoescaped). Both are the optional ``report`` extra.

Why Vega-Lite and not Plotly (docs/REPORTS.md says more): the three libraries weigh 0.9 MB minified against
plotly.min.js's 4.8 MB, and Vega-Lite's declarative specs give what the report needs, hover tooltips
(vega-tooltip), zoom and pan (interval selections bound to the scales), point selections and named data sets the
page's script replaces, with no code of ours in the drawing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from contextlib import suppress
from functools import lru_cache
from pathlib import Path
from typing import Any

from meshplan.errors import MissingDependency

VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"  # an identifier, never fetched


@lru_cache(maxsize=1)
def bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one classic script that sets ``window.vega``, ``window.vegaLite`` and
    ``window.vegaEmbed`` (vl_convert.javascript_bundle; about 0.9 MB, made once per process and kept in the user's
    cache directory per vl-convert release: bundling takes about a second, a third of a report's time)."""
    cached = _cache_dir() / f"vega-bundle-{_release()}.js"
    try:
        return cached.read_text(encoding="utf-8")
    except OSError:
        pass
    script: str = _vl_convert().javascript_bundle()  # its docstring: "Optionally, a JavaScript snippet"
    _keep(cached, script)
    return script


def _keep(path: Path, text: str) -> None:
    """``text`` written to ``path`` whole or not at all (a second report never reads half a file); a read-only home
    is no error: made again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError:
        pass


def _vl_convert() -> Any:
    try:
        import vl_convert
    except ImportError:
        raise MissingDependency("vl-convert-python", "report") from None
    return vl_convert


@lru_cache(maxsize=1)
def _release() -> str:
    """vl-convert-python's release, the key of what is cached from it: read from the name of its installed metadata
    beside the package (``vl_convert_python-1.9.0.dist-info``, the wheel's layout, PEP 427) without loading its
    87 MB library (15 ms of each report once the bundle is cached), else from the module."""
    spec = importlib.util.find_spec("vl_convert")
    if spec is None or spec.origin is None:
        raise MissingDependency("vl-convert-python", "report")
    prefix, suffix = "vl_convert_python-", ".dist-info"
    found = list(Path(spec.origin).parent.parent.glob(f"{prefix}*{suffix}"))
    if len(found) == 1:
        return found[0].name[len(prefix):-len(suffix)]
    return str(getattr(_vl_convert(), "__version__", "unknown"))


def _cache_dir() -> Path:
    """$XDG_CACHE_HOME/meshplan, else ~/.cache/meshplan (the XDG base directory specification's default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meshplan"


def require_report_extra() -> None:
    """The report's templates and its charts' runtime (the ``report`` extra), checked before a search runs: found,
    not loaded (``_release``)."""
    for module, package in (("jinja2", "jinja2"), ("vl_convert", "vl-convert-python")):
        if importlib.util.find_spec(module) is None:
            raise MissingDependency(package, "report")


def versions() -> dict[str, str]:
    """The bundled Vega and Vega-Lite versions (printed in the page's footer), kept beside the bundle."""
    cached = _cache_dir() / f"vega-versions-{_release()}.json"
    try:
        kept = json.loads(cached.read_text(encoding="utf-8"))
        if isinstance(kept, dict) and set(kept) == {"vega", "vega-lite"}:
            return {k: str(v) for k, v in kept.items()}
    except (OSError, ValueError):
        pass
    vl_convert = _vl_convert()
    found = {"vega": vl_convert.get_vega_version(), "vega-lite": vl_convert.get_vegalite_versions()[-1]}
    _keep(cached, json.dumps(found))
    return found


@lru_cache(maxsize=1)
def environment() -> Any:
    """The Jinja2 environment of the report's templates: packaged with meshplan, autoescaped, undefined names an
    error (a template that names a missing value fails instead of printing nothing). Each template's compiled code is
    kept in the user's cache directory (``_TemplateCache``): compiling the page's templates took 0.09 s of each
    report, loading them back takes milliseconds."""
    try:
        import jinja2
    except ImportError:
        raise MissingDependency("jinja2", "report") from None
    trim, lstrip, trailing, escaped = True, True, True, ["html", "j2"]
    # the code a template compiles to depends on the Jinja2 release and these settings: a cache of its own for each
    tag = hashlib.sha1(repr((jinja2.__version__, trim, lstrip, trailing, escaped)).encode()).hexdigest()[:12]
    return jinja2.Environment(loader=jinja2.PackageLoader("meshplan.report", "templates"),
                              autoescape=jinja2.select_autoescape(escaped, default=True),
                              undefined=jinja2.StrictUndefined, trim_blocks=trim, lstrip_blocks=lstrip,
                              keep_trailing_newline=trailing, bytecode_cache=_template_cache(tag))


def _template_cache(tag: str) -> Any:
    """Jinja2's own cache of compiled templates (``FileSystemBytecodeCache``: a template's entry is found by its name
    and path and used only while its source is the same, checked by its SHA-1) under ``_cache_dir()/templates``; a
    home that cannot be written is no error: the templates are compiled again next time."""
    from jinja2 import FileSystemBytecodeCache

    class _TemplateCache(FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            with suppress(OSError):  # NotADirectoryError: compiled, as without a cache
                super().load_bytecode(bucket)

        def dump_bytecode(self, bucket: Any) -> None:
            with suppress(OSError):
                os.makedirs(self.directory, exist_ok=True)
                super().dump_bytecode(bucket)

    return _TemplateCache(str(_cache_dir() / "templates"), f"{tag}-%s.cache")


def spec(**parts: Any) -> dict[str, Any]:
    """A Vega-Lite spec with the report's look: the container's width (charts fit any page width), readable axes."""
    base = {"$schema": VEGA_LITE_SCHEMA, "width": "container", "autosize": {"type": "fit-x", "contains": "padding"},
            "config": {"font": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif",
                       "axis": {"labelFontSize": 11, "titleFontSize": 12, "titleFontWeight": 500, "grid": True,
                                "gridOpacity": 0.35},
                       "legend": {"labelFontSize": 11, "titleFontSize": 11, "orient": "bottom", "labelLimit": 280,
                                  "titleLimit": 320, "direction": "horizontal", "columns": 6},
                       "title": {"fontSize": 13, "anchor": "start", "fontWeight": 600},
                       "view": {"stroke": None}}}
    return base | parts
