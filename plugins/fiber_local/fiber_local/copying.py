"""``fiber cp`` for local jobs: copy into or out of a job's directory without following a link.

A job's directory may hold files another user made (a shared directory, or one of theirs):
a link planted there could point at any file of the caller's, who may be root. So every
component of a path inside a job is opened relative to the one before it with
``O_NOFOLLOW`` (from the job's cwd, held open as the kernel knows it, or from ``/`` for an
absolute path), and a link is refused with one line, never followed. The local side is the
path the user typed: followed as typed up to its last component, which is never a link
either. A file is written beside its destination and renamed over it (the rename replaces
a name; it never writes through a link, symbolic or hard, made in the meantime).
"""

from __future__ import annotations

import os
import secrets
import stat

from fibercore.errors import ConfigError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class CopyRefused(ConfigError):
    """``fiber cp`` cannot or will not copy this path (a link, missing, not a regular file or
    directory): a one-line message naming the path, as the user wrote it, and the fix."""


def _failed(exc: OSError, shown: str) -> CopyRefused:
    return CopyRefused(f"{shown}: {exc.strerror or exc}")


def _link(shown: str) -> CopyRefused:
    return CopyRefused(
        f"{shown} is a symbolic link; fiber cp never follows a link (one made by another user "
        "could point at any file of yours): copy to or from the path it points to, if that is what you mean")


def _check(dir_fd: int, name: str, shown: str) -> os.stat_result | None:
    """``name`` in ``dir_fd``, not followed: None if missing; refused if it is a link."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise _link(shown)
    return info


def _open_dir(dir_fd: int, name: str, shown: str) -> int:
    """Directory ``name`` in ``dir_fd``, opened without following a link."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as exc:
        info = _check(dir_fd, name, shown)  # a link: refused, with its name
        if info is not None and not stat.S_ISDIR(info.st_mode):
            raise CopyRefused(f"{shown} is not a directory") from None
        raise _failed(exc, shown) from None


class Place:
    """A place to copy from or to: directory ``fd`` (owned: closed by :meth:`close`) and the
    ``name`` in it, or None for the directory itself; ``shown`` is how the user wrote it."""

    def __init__(self, fd: int, name: str | None, shown: str) -> None:
        self.fd, self.name, self.shown = fd, name, shown

    def close(self) -> None:
        os.close(self.fd)


def in_job(cwd_fd: int, jid: str, path: str) -> Place:
    """``path`` inside job ``jid`` whose cwd is ``cwd_fd``: every directory on the way opened
    with O_NOFOLLOW (the last component is checked when it is used)."""
    parts = [p for p in path.split("/") if p and p != "."]
    name = parts.pop() if parts and parts[-1] != ".." else None
    fd = os.open("/", _DIR) if path.startswith("/") else os.dup(cwd_fd)
    walked = "/" if path.startswith("/") else ""
    try:
        for part in parts:
            walked = os.path.join(walked, part)
            step = _open_dir(fd, part, f"{jid}:{walked}")
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return Place(fd, name, f"{jid}:{path}")


def local(path: str) -> Place:
    """``path`` on this machine as the user typed it: its directory as given, its last component
    never followed."""
    norm = os.path.normpath(path)
    head, name = os.path.split(norm)
    if name in ("", ".", ".."):
        head, name = norm, ""
    try:
        fd = os.open(head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _failed(exc, head or ".") from None
    return Place(fd, name or None, path)


def copy(src: Place, dst: Place) -> None:
    """Copy ``src`` (a regular file or a directory tree) to ``dst``, following no link: a file
    into a directory keeps its name; a directory's contents go into ``dst`` (made if missing)."""
    try:
        _copy(src, dst)
    except OSError as exc:  # one line (CopyRefused) rather than an OSError's two
        raise _failed(exc, dst.shown) from None


def _copy(src: Place, dst: Place) -> None:
    if src.name is None:
        _copy_tree(src.fd, dst, src.shown)
        return
    info = _check(src.fd, src.name, src.shown)
    if info is None:
        raise CopyRefused(f"{src.shown}: no such file or directory")
    if stat.S_ISDIR(info.st_mode):
        fd = _open_dir(src.fd, src.name, src.shown)
        try:
            _copy_tree(fd, dst, src.shown)
        finally:
            os.close(fd)
    elif stat.S_ISREG(info.st_mode):
        _copy_file_to(src.fd, src.name, src.shown, dst)
    else:
        raise CopyRefused(f"{src.shown} is not a regular file or directory; fiber cp copies only those")


def _copy_file_to(src_dir: int, name: str, shown: str, dst: Place) -> None:
    """File ``name`` of ``src_dir`` to ``dst``: into it when it is a directory, else as it."""
    if dst.name is None:
        _write_file(src_dir, name, shown, dst.fd, name, os.path.join(dst.shown, name))
        return
    info = _check(dst.fd, dst.name, dst.shown)
    if info is not None and stat.S_ISDIR(info.st_mode):
        fd = _open_dir(dst.fd, dst.name, dst.shown)
        try:
            _write_file(src_dir, name, shown, fd, name, os.path.join(dst.shown, name))
        finally:
            os.close(fd)
    else:
        _write_file(src_dir, name, shown, dst.fd, dst.name, dst.shown)


def _write_file(src_dir: int, name: str, shown: str, dst_dir: int, dst_name: str, dst_shown: str) -> None:
    """Copy one regular file (opened with O_NOFOLLOW) beside ``dst_name``, then rename it over
    (``dst_name`` itself is refused when it is a link or a directory)."""
    target = _check(dst_dir, dst_name, dst_shown)
    if target is not None and stat.S_ISDIR(target.st_mode):
        raise CopyRefused(f"{dst_shown} is a directory")
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_dir)
    except OSError as exc:
        _check(src_dir, name, shown)
        raise _failed(exc, shown) from None
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):  # a FIFO or a device put there meanwhile
            raise CopyRefused(f"{shown} is not a regular file or directory; fiber cp copies only those")
        os.set_blocking(src, True)
        partial = f".{dst_name}.fibercp-{secrets.token_hex(4)}"
        try:
            out = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                          0o600, dir_fd=dst_dir)
        except OSError as exc:
            raise _failed(exc, dst_shown) from None
        try:
            try:
                while chunk := os.read(src, _CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
                os.fchmod(out, stat.S_IMODE(info.st_mode) & 0o777)  # never a set-id bit
                os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
            finally:
                os.close(out)
            os.rename(partial, dst_name, src_dir_fd=dst_dir, dst_dir_fd=dst_dir)
        except BaseException as exc:
            try:
                os.unlink(partial, dir_fd=dst_dir)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise _failed(exc, dst_shown) from None
            raise
    finally:
        os.close(src)


def _copy_tree(src_fd: int, dst: Place, shown: str) -> None:
    """The contents of directory ``src_fd`` into ``dst`` (made when missing), recursively."""
    if dst.name is None:
        into = os.dup(dst.fd)
    else:
        info = _check(dst.fd, dst.name, dst.shown)
        if info is None:
            try:
                os.mkdir(dst.name, 0o700, dir_fd=dst.fd)  # widened to the source's mode once filled
            except OSError as exc:
                raise _failed(exc, dst.shown) from None
        into = _open_dir(dst.fd, dst.name, dst.shown)
    try:
        mode = stat.S_IMODE(os.fstat(src_fd).st_mode) & 0o777
        with os.scandir(src_fd) as entries:
            listed = [(entry.name, entry.stat(follow_symlinks=False)) for entry in entries]
        for name, info in listed:
            here = os.path.join(shown, name)
            there = os.path.join(dst.shown, name)
            if stat.S_ISLNK(info.st_mode):
                raise _link(here)
            if stat.S_ISDIR(info.st_mode):
                sub = _open_dir(src_fd, name, here)
                try:
                    _copy_tree(sub, Place(into, name, there), here)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(info.st_mode):
                _write_file(src_fd, name, here, into, name, there)
            else:
                raise CopyRefused(f"{here} is not a regular file or directory; fiber cp copies only those")
        if dst.name is not None:
            os.fchmod(into, mode | 0o700)
    finally:
        os.close(into)
