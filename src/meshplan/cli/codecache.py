"""The compiled code of the methods ``dataclasses`` writes, kept between the console script's runs (start-up, issue 83).

A dataclass gets its ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and, frozen, ``__setattr__`` and
``__delattr__`` as source text that ``dataclasses`` compiles with ``exec`` each time the class is defined (CPython 3.11
``Lib/dataclasses.py`` ``_create_fn``; 3.13 batches a class's texts into one, ``_FuncBuilder.add_fns_to_class``).
meshplan's spec and record classes make about 450 such texts for ``meshplan plan``; compiling them took about a sixth
of the quick start's CPU time (0.08 to 0.13 s of 0.55 s). ``Compiled.exec`` stands in for ``exec`` in the
``dataclasses`` module: a text it has met before runs its stored code object, which is what compiling the same text
gives (same text, no inherited ``__future__`` flags, as ``exec`` called from ``dataclasses``, whose module has none;
the interpreter's optimisation level), and a new text is compiled and kept. The console script keeps them in one
marshal file beside the package's bytecode (``__pycache__``, tagged with the interpreter's bytecode version as a
``.pyc`` is) and rewrites it at exit when it compiled something new, unless bytecode writing is off
(``PYTHONDONTWRITEBYTECODE``, ``-B``), as Python does for ``.pyc`` files. Each code object is kept as its own marshal
bytes and loaded when its text comes: a file holds the texts of its command's runs (and of classes since changed, up
to ``MAX_TEXTS``), a run uses most of them, and making the code objects was what reading the file cost
(a developer's checkout, 2 571 texts: 29 ms as code objects, against 1 ms as bytes and 3 ms to load the 544 a quick
start uses; a file of 760 texts, the speed guard's commands alone: 3 ms either way). Each command keeps
a file of its own (``Compiled.for_command``, chosen before the command is imported): reading the file was what
a run paid for every other command's texts, and in a developer's checkout that file grew to 2 580 texts (3.4 MB,
9 to 20 ms to read on a loaded 2-core host, against 2 to 7 ms for the 565 that `meshplan plan`'s file holds).
Only the console script installs it, before its commands are imported (its process is meshplan's alone,
cli/__init__.py); a program that imports meshplan keeps ``dataclasses`` as it is.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import marshal
import os
import sys
from types import CodeType
from typing import Any

# beyond this many texts a file keeps only those one run used (texts of classes since changed are dropped): a file is
# one command's (its variants together use under a thousand), so that the stale texts of a developer's edits are not
# read by every run
MAX_TEXTS = 1500


class Compiled:
    """Source text → its code object as marshal's bytes (those of the file at ``path`` read when the first text
    comes: a command that defines no dataclass, ``meshplan --help``, reads nothing; each loaded when its text comes),
    and how many were compiled since."""

    def __init__(self, codes: dict[str, bytes] | None = None, path: str | None = None) -> None:
        self.codes = dict(codes or {})
        self.path = path  # the file read when the first text comes (None once read)
        self.file = path  # the file written back at exit (install)
        self.used: set[str] = set()
        self.compiled = 0

    def for_command(self, name: str) -> None:
        """The file of command ``name``'s texts (``cache_path``'s, of kind ``dataclass-methods-NAME``) in place of the
        one given, while no text has come (the file given is read and written otherwise)."""
        path = cache_path(f"dataclass-methods-{name}")
        if path is not None and self.path is not None and not self.used:
            self.path = self.file = path

    def exec(self, source: Any, globals: Any = None, locals: Any = None) -> None:  # noqa: A002 (exec's own names)
        """``exec(source, globals, locals)``, a source text compiled once."""
        if not isinstance(source, str):
            builtins.exec(source, globals, locals)
            return
        if self.path is not None:
            self.codes = read_codes(self.path) | self.codes
            self.path = None
        code = _loaded(self.codes.get(source))
        if code is None:
            code = compile(source, "<string>", "exec", dont_inherit=True)
            self.codes[source] = marshal.dumps(code)
            self.compiled += 1
        self.used.add(source)
        builtins.exec(code, globals, locals)

    def kept(self) -> dict[str, bytes]:
        """What the file keeps: every text, or this run's alone once there are more than ``MAX_TEXTS``."""
        return within_limit(self.codes, self.used)


def _loaded(kept: bytes | None) -> CodeType | None:
    """The code object of marshal's bytes ``kept``; None where there are none or they hold no code object."""
    if kept is None:
        return None
    try:
        code = marshal.loads(kept)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def within_limit(store: dict[str, Any], used: set[str]) -> dict[str, Any]:
    """``store`` whole, or the texts of ``used`` alone once it holds more than ``MAX_TEXTS``."""
    return store if len(store) <= MAX_TEXTS else {text: store[text] for text in used}


class Parsed:
    """A preset's TOML text → its document as ``tomllib`` parses it, kept as marshal's bytes (each ``get`` a fresh
    copy, as a parse gives: a caller may change it); those of the file at ``path`` read when the first text comes.
    The text is the key, as for the methods' code: a preset changed is a new text, parsed afresh."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.documents: dict[str, bytes] = {}
        self.used: set[str] = set()
        self.added = 0

    def _read(self) -> None:
        if self.path is not None:
            self.documents = read_kept(self.path, bytes) | self.documents
            self.path = None

    def kept(self) -> dict[str, bytes]:
        """What the file keeps (``Compiled.kept``)."""
        return within_limit(self.documents, self.used)

    def get(self, text: str) -> Any:
        """The document of ``text`` parsed before, None if it was not."""
        self._read()
        found = self.documents.get(text)
        if found is None:
            return None
        self.used.add(text)
        return marshal.loads(found)

    def put(self, text: str, document: dict[str, Any]) -> None:
        """``document``, parsed from ``text``, kept; not one with a TOML date or time (marshal writes none)."""
        self._read()
        try:
            self.documents[text] = marshal.dumps(document)
        except ValueError:
            return
        self.used.add(text)
        self.added += 1


def cache_path(kind: str = "dataclass-methods") -> str | None:
    """The file beside the package's bytecode; None where the interpreter writes no bytecode versions."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    package = os.path.dirname(os.path.dirname(__file__))  # meshplan's own folder
    return os.path.join(package, "__pycache__", f"{kind}.{tag}.marshal")


def read_codes(path: str) -> dict[str, bytes]:
    """The texts and their code objects' marshal bytes kept at ``path`` (``read_kept``; a file of code objects
    themselves, as this module wrote before, is none)."""
    return read_kept(path, bytes)


def read_kept(path: str, kind: type) -> dict[str, Any]:
    """The texts and their ``kind`` values kept at ``path``; none when it is missing, unreadable, not such a file or
    written by another interpreter build (``sys.version``: marshal's format of code objects is that build's)."""
    try:
        with open(path, "rb") as f:
            kept = marshal.loads(f.read())  # marshal.load(f) reads the file in small pieces: ten times slower
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not (isinstance(kept, tuple) and len(kept) == 2 and kept[0] == sys.version and isinstance(kept[1], dict)):
        return {}
    return {k: v for k, v in kept[1].items() if isinstance(k, str) and isinstance(v, kind)}


def write_codes(path: str, codes: dict[str, Any]) -> None:
    """``codes`` to ``path`` whole or not at all (a temporary file renamed over it); nothing where it cannot write."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(marshal.dumps((sys.version, codes)))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


# the console script's store of methods' code, once installed (cli/main.py names its command's file)
INSTALLED: dict[str, Compiled] = {}


def install() -> Compiled | None:
    """For the console script: ``dataclasses`` compiles through a ``Compiled`` of the cache file, written back at
    exit when something new was compiled and bytecode writing is on. None where there is no file to keep."""
    path = cache_path()
    if path is None or "exec" in vars(dataclasses):
        return None
    compiled = INSTALLED["methods"] = Compiled(path=path)
    dataclasses.exec = compiled.exec  # type: ignore[attr-defined]  # the module's global shadows the builtin

    def save() -> None:
        if compiled.compiled and compiled.file is not None and not sys.dont_write_bytecode:
            write_codes(compiled.file, compiled.kept())

    atexit.register(save)
    return compiled


def install_presets() -> Parsed | None:
    """For the console script, when its command is about to be imported (cli/main.py; ``meshplan --help`` imports no
    preset reader): the presets' TOML parsed through a ``Parsed`` of its own file (meshplan.files.PARSED), written
    back at exit when something new was parsed and bytecode writing is on. None where there is no file to keep."""
    from meshplan import files  # noqa: PLC0415  (its pathlib and json: not for --help)

    path = cache_path("presets-parsed")
    if path is None or files.PARSED is not None:
        return None
    parsed = files.PARSED = Parsed(path)

    def save() -> None:
        if parsed.added and not sys.dont_write_bytecode:
            write_codes(path, parsed.kept())

    atexit.register(save)
    return parsed
