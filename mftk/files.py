"""Files mftk reads and writes for users.

Writes: whole or not at all (a temp file beside the target, renamed into place).

Reads: every file mftk opens is a regular file (or a directory where one is expected) and every
file read whole is bounded in size. A path the user names can be anything: ``/dev/zero`` (an
endless read), a FIFO (an ``open`` that blocks forever), a symlink to either. `open_regular`
opens without blocking and checks what it opened (``fstat`` of the open descriptor, so a file
swapped in between is caught too); `read_bytes`/`read_text`/`read_json` add the size bound and
turn every failure into the caller's typed error naming the file. ``FileNotFoundError`` passes
through untouched, so each caller words a missing file in its own terms.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable, TextIO

from mftk.errors import InputError, MftkError

KiB, MiB = 1 << 10, 1 << 20
# Bounds for files read whole, far above any real one (a 2.1.0 YAML is ~10 KiB, a 671B model's
# metadata.json ~20 MiB) and far below what would exhaust memory.
CONFIG_LIMIT = 16 * MiB  # YAML configs, HF config.json, tokenizer configs
SMALL_JSON_LIMIT = 16 * MiB  # common.json, mftk-config.json, extra state, the tracker
LARGE_JSON_LIMIT = 1024 * MiB  # metadata.json, HF index files, tokenizer.json
MAX_JSON_DEPTH = 64  # nesting any mftk-read JSON may have; deeper is refused before parsing


def publish(tmp: str, path: Path) -> None:
    """Give a finished temp file normal permissions (mkstemp makes it 0600) and rename it into place."""
    mask = os.umask(0)
    os.umask(mask)
    try:
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except OSError as exc:
        raise _write_error(Path(path), exc) from None


def check_writable_target(path: str | os.PathLike) -> Path:
    """Fail before the work, not after it, when an output file cannot be written where asked: its
    directory must exist and be writable, and the path must not be a directory."""
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        raise InputError(message=f"cannot write {path}: directory {parent} does not exist", path=str(path),
                         hint=f"create it first: mkdir -p {parent}")
    if path.is_dir():
        raise InputError(message=f"cannot write {path}: it is a directory", path=str(path),
                         hint=f"name a file, e.g. {path / 'out'}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(message=f"cannot write {path}: directory {parent} is not writable", path=str(path),
                         hint="choose a writable location")
    return path


def temp_beside(path: Path, suffix: str = ".tmp") -> tuple[int, str]:
    """``mkstemp`` next to ``path`` (same filesystem, so the rename is atomic); errors name ``path``."""
    check_writable_target(path)
    try:
        import tempfile  # here: most commands never write one (10 ms of `mftk preprocess`'s start)

        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    except OSError as exc:
        raise _write_error(path, exc) from None


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside `path` and rename it into place: never a half-written export."""
    write_atomic_with(path, lambda f: f.write(text))


def write_atomic_with(path: Path, write: Callable[[TextIO], Any]) -> None:
    """`write_atomic` of what `write` writes to the open text file, a piece at a time (an export of a log of
    any length: never the whole text in memory)."""
    path = Path(path)
    fd, tmp = temp_beside(path)
    try:
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                write(f)
        except OSError as exc:
            raise _write_error(path, exc) from None
        publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_error(path: Path, exc: OSError) -> InputError:
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return InputError(message=f"cannot write {path}: {exc.strerror or exc}", path=str(path),
                      hint="free disk space, or write elsewhere" if full else "choose a writable location")


# ------------------------------------------------------------------------------------------ reads
def _fail(error: type[MftkError], path: str, message: str, hint: str = "") -> MftkError:
    return error(message=f"{path}: {message}", path=path, hint=hint)  # type: ignore[call-arg]


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike, *, error: type[MftkError] = InputError, what: str = "file",
                 hint: str = "") -> BinaryIO:
    """Open ``path`` for reading if it is (or links to) a regular file; never blocks on a FIFO or device.

    The check is made on the opened descriptor, so the file that is read is the file that was checked.
    """
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _fail(error, p, f"cannot read the {what} ({exc.strerror or exc})", hint) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _fail(error, p, f"the {what} is {kind_of(mode)}, not a regular file",
                        hint or f"pass the path of a regular {what}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, *, limit: int, error: type[MftkError] = InputError, what: str = "file",
               hint: str = "") -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes (checked while reading, so a file
    that grows, or lies about its size, cannot push memory past the bound)."""
    with open_regular(path, error=error, what=what, hint=hint) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise _fail(error, os.fspath(path), f"the {what} is {_size(size)}, over the {_size(limit)} limit "
                        f"for a {what}", hint or f"is this really a {what}?")
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise _fail(error, os.fspath(path), f"cannot read the {what} ({exc.strerror or exc})", hint) from None
    if len(data) > limit:
        raise _fail(error, os.fspath(path), f"the {what} is over the {_size(limit)} limit for a {what}",
                    hint or f"is this really a {what}?")
    return data


def read_text(path: str | os.PathLike, *, limit: int, error: type[MftkError] = InputError, what: str = "file",
              hint: str = "", encoding: str = "utf-8") -> str:
    """`read_bytes`, decoded; a decoding failure names the byte."""
    data = read_bytes(path, limit=limit, error=error, what=what, hint=hint)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise _fail(error, os.fspath(path), f"the {what} is not UTF-8 text (byte {exc.start})",
                    hint or f"pass a UTF-8 {what}") from None


def read_json(path: str | os.PathLike, *, limit: int, error: type[MftkError] = InputError, what: str = "JSON file",
              hint: str = "") -> Any:
    """`read_text` parsed as JSON with `parse_json`."""
    p = os.fspath(path)
    return parse_json(read_text(p, limit=limit, error=error, what=what, hint=hint), where=p, error=error, hint=hint)


def parse_json(text: str | bytes, *, where: str, error: type[MftkError] = InputError, hint: str = "") -> Any:
    """``json.loads`` whose every failure is ``error``: syntax, bad UTF-8, and nesting deeper than
    `MAX_JSON_DEPTH` (Python's parser would raise RecursionError, and so would any later walk of the data)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(error, where, f"not UTF-8 JSON (byte {exc.start})", hint) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(error, where, f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
                    hint) from None
    except RecursionError:
        data = None
    else:
        if text.count("[") + text.count("{") <= MAX_JSON_DEPTH or json_depth(data) <= MAX_JSON_DEPTH:
            return data
    raise _fail(error, where, f"JSON nested more than {MAX_JSON_DEPTH} levels deep",
                hint or "no file mftk reads nests this deeply; check the path")


def json_depth(data: Any) -> int:
    """The nesting depth of parsed JSON (a scalar is 0), walked without recursion; stops past the limit."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
            stack.extend((child, depth) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def regular_file_or_error(path: str | os.PathLike, *, error: type[MftkError] = InputError, what: str = "file",
                          hint: str = "") -> os.stat_result:
    """``stat`` of a path that must be a regular file (for files read by mmap or by another library)."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _fail(error, p, f"cannot read the {what} ({exc.strerror or exc})", hint) from None
    if not stat.S_ISREG(st.st_mode):
        raise _fail(error, p, f"the {what} is {kind_of(st.st_mode)}, not a regular file",
                    hint or f"pass the path of a regular {what}")
    return st


def _size(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n / KiB:.0f} KiB" if n >= KiB else f"{n} bytes"


# ---------------------------------------------------------------------------- paths the user writes
# One rule for every path in a YAML and on the command line (`mftk.config.paths` applies it to the config):
# ``~``, ``~user``, ``$VAR`` and ``${VAR}`` expand as a shell would; what cannot be expanded is refused.

_VARIABLE = re.compile(r"\$(?:(\w+)|\{([^}]*)\})")
EXPANSION_HINT = "write the path out in full, or define what it names first (export NAME=... for a variable)"


class UnexpandablePath(ValueError):
    """A path that names an unset environment variable or an unknown user (the message says which)."""


def expand_path(text: str) -> str:
    """``~``, ``~user``, ``$VAR`` and ``${VAR}`` expanded as a shell would; `UnexpandablePath` when one cannot be."""
    out = text
    if out.startswith("~"):
        out = os.path.expanduser(out)
        if out.startswith("~"):
            raise UnexpandablePath(f"{text!r} starts with {text.split('/')[0]!r}, which is no user's home folder")
    for match in _VARIABLE.finditer(out):
        name = match.group(1) if match.group(1) is not None else match.group(2)
        if not name or name not in os.environ:
            raise UnexpandablePath(f"{text!r} names the environment variable {match.group(0)}, which is not set")
    return os.path.expandvars(out)


def cli_path(text: str, option: str) -> str:
    """A path given on the command line, expanded by `expand_path` (for ``--opt=~/x``, which no shell expands);
    an `InputError` (exit 2) naming the option otherwise."""
    try:
        return expand_path(text)
    except UnexpandablePath as exc:
        raise InputError(message=f"{option}: {exc}", hint=EXPANSION_HINT) from None


def home_relative(path: str) -> str:
    """``path`` with the home folder written ``~`` (for display: mftk never prints an absolute home path)."""
    home = os.path.expanduser("~")
    if home not in ("~", "/") and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")):]
    return path
