"""User files in and out: every way reading or writing one can fail becomes one SpecError naming the option.

A user points meshplan at files (``--model config.json``, ``--system my.toml``, ``validate runs.jsonl``) and at
places to write (``report -o``, ``sweep -o``, ``calibrate --out``). Missing files, directories given as files,
permissions, bytes that are not UTF-8, numbers Python will not parse and full disks are all bad input: the
message names the option and the path (``model='x/config.json': not UTF-8 text (byte 0xff at 0)``), never a
traceback. ``writable`` checks an output before the work that produces it, ``write_text`` / ``write_bytes``
report what the operating system says when the write itself fails (``/dev/full``, ``/proc``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from meshplan.errors import SpecError
from meshplan.kept import Kept

# The built-in presets (models, hardware, stacks, engines, error bands): package data beside this file, read as plain
# files (what importlib.resources.files gives for a package installed as a directory, without importing it: its
# tempfile, shutil and zipfile are a tenth of a command's start-up).
PRESETS = Path(__file__).resolve().parent / "presets"

def _os_reason(exc: OSError) -> str:
    """``[Errno 21] Is a directory`` → ``is a directory``: the operating system's reason, lower case."""
    reason = exc.strerror or type(exc).__name__
    return reason[:1].lower() + reason[1:]


# The lengths Linux refuses (linux/limits.h): NAME_MAX, one name in a path, and PATH_MAX, the whole path, in bytes.
NAME_MAX, PATH_MAX = 255, 4096
# What a path that exists but is not a regular file is (stat.S_IFMT): reading a FIFO or a terminal blocks until
# someone writes, reading /dev/zero never ends, so inputs are regular files only; outputs may be a character device
# (/dev/null, /dev/full: they never block) but not a FIFO or a socket (opening one to write blocks for a reader).
_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _too_long_name(path: str) -> str | None:
    """Why the operating system would refuse ``path`` for its length (ENAMETOOLONG), or None."""
    raw = os.fsencode(path)
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX:
        return f"a name in it is {longest:,} bytes long (at most {NAME_MAX})"
    if len(raw) >= PATH_MAX:
        return f"it is {len(raw):,} bytes long (at most {PATH_MAX - 1:,})"
    return None


def _kind(mode: int) -> str | None:
    return next((name for test, name in _KINDS if test(mode)), None)


def _status(path: str, field: str) -> os.stat_result | None:
    """os.stat of ``path`` (following links), None where nothing is there; the refusals (a name too long, a link
    loop, a file used as a folder, permission) as one SpecError naming the option."""
    if path == "":
        raise SpecError(f"{field}='' is empty: give a file")
    long = _too_long_name(path)
    if long:
        raise SpecError(f"{field}={_shown(path)}: the name is too long: {long}")
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # the callers say which folder is missing or a file
        return None
    except OSError as exc:
        why = "a symbolic link loop" if exc.errno == errno.ELOOP else _os_reason(exc)
        raise SpecError(f"{field}={_shown(path)}: cannot use it: {why}") from None


def _shown(path: str) -> str:
    """The path as an error line quotes it: whole up to 80 characters, else its ends."""
    return repr(path) if len(path) <= 80 else repr(f"{path[:40]}…{path[-30:]}")


def check_input(path: str | Path, field: str) -> None:
    """An input file must exist and be a regular file: a directory, a FIFO (reading it blocks until a writer
    comes), a device (/dev/zero never ends), a link loop or a name the OS refuses is one SpecError naming ``field``."""
    text = str(path)
    found = _status(text, field)
    if found is None:
        raise SpecError(f"{field}={_shown(text)}: no such file")
    if stat.S_ISDIR(found.st_mode):
        raise SpecError(f"{field}={_shown(text)} is a directory, not a file")
    kind = _kind(found.st_mode)
    if kind:
        raise SpecError(f"{field}={_shown(text)} is {kind}, not a regular file")


def check_output(path: str | Path, field: str) -> None:
    """An output file must be creatable: not a directory, a FIFO or a socket (opening one to write blocks until a
    reader comes), nor a link loop or a name the OS refuses; a character device (/dev/null) is fine."""
    text = str(Path(path).expanduser()) if str(path) else ""
    found = _status(text, field)
    if found is None:
        return
    if stat.S_ISDIR(found.st_mode):
        raise SpecError(f"{field}={_shown(str(path))} is a directory, not a file")
    kind = _kind(found.st_mode)
    if kind and not stat.S_ISCHR(found.st_mode):
        raise SpecError(f"{field}={_shown(str(path))} is {kind}: writing to it would block (give a file)")


def read_text(path: str | Path, field: str) -> str:
    """The file's text (UTF-8, a byte-order mark dropped, CRLF and CR line ends read as LF: what Windows editors and
    Excel write); ``field`` is the option that named it."""
    check_input(path, field)
    target = Path(path)
    try:
        return target.read_text(encoding="utf-8-sig")  # text mode: universal newlines
    except FileNotFoundError:
        raise SpecError(f"{field}={str(path)!r}: no such file") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{field}={str(path)!r}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                        f"{exc.start})") from None
    except OSError as exc:
        raise SpecError(f"{field}={str(path)!r}: cannot read: {_os_reason(exc)}") from None


class _Digits(str):
    """An integer of more digits than Python converts (sys.get_int_max_str_digits, 4,300), kept as its text so
    that the error can name its key."""


def _int(text: str) -> int | _Digits:
    try:
        return int(text)
    except ValueError:
        return _Digits(text)


def _too_long(value: Any, key: str = "") -> str | None:
    """``key=digits…`` of the first over-long integer in a parsed document, or None."""
    if isinstance(value, _Digits):
        return f"{key or 'value'}={value[:20]}… ({len(value.lstrip('-')):,} digits)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _too_long(v, (f"{key}.{k}" if key else k) if isinstance(k, str) else f"{key}[{k}]")
        if found:
            return found
    return None


def _long_number(where: str, found: str) -> SpecError:
    return SpecError(f"{where}: {found} is an integer of more digits than Python converts (4,300)")


def parse_json(text: str, where: str) -> Any:
    """One JSON document; malformed JSON names ``where``, a number too long for Python (4300+ digits) its key."""
    try:
        data = json.loads(text, parse_int=_int)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise SpecError(f"{where}: unreadable JSON: {exc}") from None
    found = _too_long(data)
    if found:
        raise _long_number(where, found)
    return data


def read_json(path: str | Path, field: str) -> Any:
    return parse_json(read_text(path, field), f"{field}={str(path)!r}")


# The console script's parsed presets (cli/codecache.py installs a Parsed: text → document, kept between its runs);
# None in a program that imports meshplan, whose presets are parsed each time.
PARSED: Any = None


def preset_toml(text: str, where: str) -> dict[str, Any]:
    """A built-in preset's TOML document: parsed before (PARSED) or now."""
    if PARSED is not None:
        found = PARSED.get(text)
        if found is not None:
            return found
    document = parse_toml(text, where)
    if PARSED is not None:
        PARSED.put(text, document)
    return document


def read_preset(relative: str, where: str) -> dict[str, Any]:
    """The TOML document of the built-in preset at ``relative`` under PRESETS (``preset_toml``), over the preset it
    ``extends`` (``derived``)."""
    path = PRESETS / relative
    return derived(preset_toml(path.read_text(encoding="utf-8"), where), path, where, path.parent)


# The specs built from built-in presets (``preset_spec``), by builder, name and the resolved document's JSON text: a
# validation maps every record to its system, and vTrain's 720 runs built the same a100 System 720 times (load_system:
# 2.0 of 24.5 s profiled). The document is still read (and parsed, or copied from PARSED) each time, so a preset or the
# base it extends, changed under a running program, is built afresh; a spec is frozen, so one object serves every
# caller. A document JSON cannot write (a TOML date) is built each time; an error is raised each time, never kept. The
# key is of values, not ids (kept.Kept's usual key): each call reads a fresh document, whose id says nothing, while
# equal text is an equal document (keys sorted; 1, 1.0, true, -0.0 and 0.0 written apart), and the builder is held by
# the key itself, so nothing is held beside it. The last 256 are kept: a bound on what a long process keeps.
_SPECS: Kept[Any] = Kept(256)
_Spec = TypeVar("_Spec")


def preset_spec(relative: str, where: str, build: Callable[[dict[str, Any], str], _Spec], name: str) -> _Spec:
    """``build(read_preset(relative, where), name)``: the same (frozen) spec for the same resolved document."""
    document = read_preset(relative, where)
    try:
        key = (build, name, json.dumps(document, sort_keys=True))
    except (TypeError, ValueError):  # a value JSON does not write (a TOML date or time)
        return build(document, name)
    spec: _Spec = _SPECS.answer(key, None, build, document, name)
    return spec


# ``extends = "<preset>"`` (or ``"<file>.toml"``, a path from the file's folder): the base's document, its own
# ``extends`` resolved first, with the file's keys over it. A table merges key by key, recursively (a file that sets
# ``[accelerator] hbm_bytes`` keeps the base's other accelerator keys); any other value, an array (of tables) too,
# replaces the base's whole. A value and its source comment stay in the file that sets it; a derived file cannot
# unset a key (it sets the default instead). A name is a preset of ``folder`` (presets/engines/, stacks/, hardware/,
# models/: the loader's own); a cycle is refused in one line naming its files.
def derived(document: dict[str, Any], path: Path, where: str, folder: Path,
            chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """``document`` (the TOML file at ``path``) merged over the document its ``extends`` names."""
    base = document.get("extends")
    if base is None:
        return document
    chain = (*chain, path.resolve())
    target = _base_path(base, chain[-1], where, folder)
    if target in chain:
        files = " -> ".join(_shown_preset(p) for p in (*chain[chain.index(target):], target))
        raise SpecError(f"{where}: extends = {base!r} makes a cycle: {files}")
    inner = f"{where} (extends {_shown_preset(target)})"
    if target.is_relative_to(PRESETS):
        parent = preset_toml(target.read_text(encoding="utf-8"), inner)
    else:
        parent = parse_toml(read_text(target, f"{where}: extends"), inner)
    return _merged(derived(parent, target, inner, folder, chain), {k: v for k, v in document.items() if k != "extends"})


def _base_path(base: Any, path: Path, where: str, folder: Path) -> Path:
    """The file ``extends = base`` names: a preset of ``folder``, or a .toml file from ``path``'s folder."""
    if not isinstance(base, str) or not base or "\0" in base:
        raise SpecError(f"{where}: extends must name a preset or a .toml file, not {base!r}")
    if base.lower().endswith(".toml"):
        return (path.parent / base).resolve()
    names = sorted(p.name.removesuffix(".toml") for p in folder.glob("*.toml"))  # the folder's own: no path out of it
    if base not in names:
        raise SpecError(f"{where}: extends = {base!r} is neither a preset of presets/{folder.name}/ "
                        f"({', '.join(names)}) nor a .toml file")
    return (folder / f"{base}.toml").resolve()  # as the chain holds them (derived)


def _shown_preset(path: Path) -> str:
    """A preset file as an error names it: ``engines/vllm.toml`` under PRESETS, else its path."""
    return str(path.relative_to(PRESETS)) if path.is_relative_to(PRESETS) else str(path)


def _merged(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``own``'s keys over ``base``'s, a table into a table key by key (``derived``)."""
    out = dict(base)
    for key, value in own.items():
        below = out.get(key)
        out[key] = _merged(below, value) if isinstance(value, dict) and isinstance(below, dict) else value
    return out


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """One TOML document (tomllib's own error says where in it); ``where`` names the file."""
    import tomllib  # noqa: PLC0415  (a console script's presets come parsed: PARSED)

    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        long = re.search(_LONG_TOML, text, re.MULTILINE) if "digits" in str(exc) else None
        if long:  # an integer of 4,300+ digits: name its key, as parse_json does
            digits = long.group(2)
            raise _long_number(where, f"{long.group(1)}={digits[:20]}… ({len(digits):,} digits)") from None
        kind = "malformed" if isinstance(exc, tomllib.TOMLDecodeError) else "unreadable"
        raise SpecError(f"{where}: {kind} TOML: {exc}") from None


# compiled by re on first use (its own cache): a start-up that reads no bad TOML compiles none (issue 83)
_LONG_TOML = r"^\s*([\w.\"'-]+)\s*=\s*[+-]?([0-9_]{4301,})"


def read_toml(path: str | Path, field: str, presets: str = "") -> dict[str, Any]:
    """A user's TOML file; with ``presets`` (``engines``, ``stacks``, ``hardware``, ``models``) over the preset or
    file its ``extends`` names (``derived``)."""
    where = f"{field}={str(path)!r}"
    document = parse_toml(read_text(path, field), where)
    return derived(document, Path(path), where, PRESETS / presets) if presets else document


def writable(path: str | Path, field: str) -> None:
    """Fail before the work, not after it, when an output file cannot be created where the user asked."""
    if str(path) == "":
        raise SpecError(f"{field}='' is empty: give a file name")
    check_output(path, field)
    target = Path(path).expanduser()
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise SpecError(f"{field}={str(path)!r}: {str(parent)!r} is a file, not a directory")
    if not parent.is_dir():
        raise SpecError(f"{field}={str(path)!r}: directory {str(parent)!r} does not exist")
    if not os.access(target if target.exists() else parent, os.W_OK):
        raise SpecError(f"{field}={str(path)!r}: permission denied")
    _open_once(target, str(path), field)


def _open_once(target: Path, path: str, field: str) -> None:
    """Open the file for writing as the write will: ``os.access`` answers yes to root for /proc, whose directories
    take no new file, so the failure would come after the work. A new file is created and removed again, an existing
    one opened without truncating it (O_NONBLOCK: a FIFO without a reader fails at once, ENXIO)."""
    existed = target.exists()
    flags = os.O_WRONLY | os.O_NONBLOCK | (0 if existed else os.O_CREAT | os.O_EXCL)
    try:
        os.close(os.open(target, flags, 0o666))
    except OSError as exc:
        raise SpecError(f"{field}={path!r}: cannot write: {_os_reason(exc)}") from None
    if not existed:
        target.unlink(missing_ok=True)


def writable_dir(path: str | Path, field: str) -> None:
    """An output directory: it may exist (as a directory) or be created, with its missing parents, below the
    nearest existing directory, which must be writable."""
    if str(path) == "":
        raise SpecError(f"{field}='' is empty: give a directory")
    target = Path(path).expanduser()
    _status(str(target), field)  # a name too long, a link loop
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        raise SpecError(f"{field}={str(path)!r}: {str(existing)!r} is a file, not a directory")
    if not os.access(existing, os.W_OK):
        raise SpecError(f"{field}={str(path)!r}: permission denied")


def make_dir(path: str | Path, field: str) -> Path:
    """Create the output directory (and its parents) or say why not."""
    target = Path(path).expanduser()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"{field}={str(path)!r}: cannot create the directory: {_os_reason(exc)}") from None
    return target


def write_text(path: str | Path, text: str, field: str) -> Path:
    return write_bytes(path, text.encode("utf-8"), field)


def write_bytes(path: str | Path, data: bytes, field: str) -> Path:
    """Write ``data`` to ``path``; a failure (no space, read-only file system, /proc) names the option."""
    target = Path(path).expanduser()
    check_output(target, field)
    try:  # O_NONBLOCK: a FIFO put there since the check fails (ENXIO) instead of waiting for a reader
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o666)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise SpecError(f"{field}={str(path)!r}: cannot write: {_os_reason(exc)}") from None
    return target
