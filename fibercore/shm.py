"""Every ``/dev/shm`` file fibercore makes or opens, and the one way each is opened by name.

Files here are shared objects (:mod:`fibercore.sharing`), ``Value``/``Array`` segments
(:mod:`fibercore.sync.shared`), parameter-server boards (:mod:`fibercore.paramserver.board`)
and copies of shared objects read from another machine. ``/dev/shm`` is writable by every
user of the machine, so a name is only a hint: another user can create a file under a
name before it is made, or after it was removed. Hence:

* a file is made with ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600 (:func:`create_segment`);
* a file is opened by name only through :func:`open_segment`: no link followed, no FIFO or
  device (opened non-blocking, then required to be a regular file), owned by this user,
  no access for anyone else, large enough, and starting with the random tag its handle
  carries (which only the creator and the processes it sent the handle to know);
* a file is removed only while it is still the one made here (:func:`remove_segment`
  compares the inode), and :func:`sweep` removes only this user's regular files whose
  maker is gone (``lstat``, no link followed).

Names: ``fcs-<pid>-<start ticks>-<kind>-<random>`` made by process ``pid`` (kind ``o`` a
shared object, ``ps`` a board, ``v`` a ``Value``/``Array``; old releases made
``fcs-<pid>-<ticks>-<random>``), and ``fcs-copy-<tag>`` for a copy, made by whichever
process of the machine asked first.
"""

from __future__ import annotations

import hmac
import os
import stat

from fibercore.util import process_start

#: Where segments live (Linux's POSIX shared memory).
SHM_DIR = "/dev/shm"
#: Name prefix of every file fibercore makes there.
PREFIX = "fcs-"
#: Name prefix of a copy read from another machine (followed by the tag, hex).
COPY_PREFIX = PREFIX + "copy-"


def segment_path(name: str) -> str:
    """The path of segment ``name``; a name that would leave ``/dev/shm`` is refused."""
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise ValueError(f"{name!r} is not a shared-memory segment name")
    return os.path.join(SHM_DIR, name)


def new_name(kind: str) -> str:
    """A fresh name for a segment of this process: who made it is in the name (:func:`sweep`)."""
    pid = os.getpid()
    return f"{PREFIX}{pid}-{process_start(pid) or 0}-{kind}-{os.urandom(6).hex()}"


def create_segment(name: str) -> int:
    """A descriptor (read-write) of the new, empty file ``name``, mode 0600; fails if the
    name exists (whoever made it)."""
    return os.open(segment_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def identity(fd: int) -> tuple[int, int]:
    """(device, inode) of a descriptor: which file a name must still be for :func:`remove_segment`."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def not_ours(fd: int, tag: bytes, min_size: int) -> str | None:
    """Why the file ``fd`` is not the segment a handle names, or None when it is: a regular
    file, this user's, no access for others, ``min_size`` bytes or more, starting with ``tag``
    (``"tag"`` when only the size or the tag differ: a file of this user still being made,
    not yet sized or tagged, or another of this user's segments under the name)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owner {st.st_uid}"
    if st.st_mode & 0o077:
        return f"mode {st.st_mode & 0o777:o}"
    if st.st_size < min_size or not hmac.compare_digest(os.pread(fd, len(tag), 0), tag):
        return "tag"  # this user's, private: being made (not sized, or its tag not written yet), or another
    return None


def open_segment(name: str, tag: bytes, min_size: int, *, writable: bool = False) -> tuple[int | None, str | None]:
    """Open segment ``name`` as the handle that knows ``tag`` expects it.

    ``(fd, None)`` when it is that segment; ``(None, "missing")`` when nothing is there;
    ``(None, "tag")`` when a private file of this user is there, too small or with another tag
    (a copy still being made); ``(None, why)`` when the file is not ours (a link, another owner,
    access for others): it must never be used.
    """
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(segment_path(name), flags)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:  # ELOOP: a link; EACCES: another user's file
        return None, f"cannot be opened ({os.strerror(exc.errno or 0)})"
    try:
        why = not_ours(fd, tag, min_size)
    except OSError as exc:
        why = f"cannot be read ({os.strerror(exc.errno or 0)})"
    if why is None:
        return fd, None
    os.close(fd)
    return None, why


def remove_segment(name: str, made: tuple[int, int] | None = None) -> bool:
    """Remove segment ``name`` if it is still the file made here (``made``: its
    :func:`identity`; None: any regular file of this user). Never follows a link."""
    try:
        path = segment_path(name)
        st = os.lstat(path)
    except (OSError, ValueError):
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return False
    if made is not None and (st.st_dev, st.st_ino) != made:
        return False
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def maker(name: str) -> tuple[int, str] | None:
    """(pid, start ticks) of the process that made segment ``name``; None for a copy or a
    name that is not fibercore's."""
    if not name.startswith(PREFIX) or name.startswith(COPY_PREFIX):
        return None
    fields = name[len(PREFIX):].split("-")
    if len(fields) < 3 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    return int(fields[0]), fields[1]


def in_use_by_me() -> set[str]:
    """Paths under ``/dev/shm`` that a process of this user holds open or mapped."""
    me = os.geteuid()
    used: set[str] = set()
    prefix = os.path.join(SHM_DIR, PREFIX)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != me:
                continue
            # Descriptors before mappings: a process that maps a file then closes its
            # descriptor (a reader taking a copy) is seen holding it by one look or the other.
            for fd in os.listdir(f"/proc/{entry}/fd"):
                try:
                    target = os.readlink(f"/proc/{entry}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(prefix):
                    used.add(target)
            with open(f"/proc/{entry}/maps", "rb") as fh:
                for line in fh:
                    at = line.find(prefix.encode())
                    if at >= 0:
                        used.add(line[at:].split(None, 1)[0].decode(errors="replace"))
        except OSError:  # gone, or not ours to read
            continue
    return used


def sweep() -> list[str]:
    """Remove this user's segments that nothing will use again: those whose maker is gone
    (after a SIGKILL that also took Python's resource tracker), and copies that no process
    of this user holds open or mapped. Only regular files this user owns (``lstat``: no link
    is followed). The names removed."""
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    me = os.geteuid()
    copies: list[str] = []
    for name in names:
        if not name.startswith(PREFIX):
            continue
        try:
            st = os.lstat(os.path.join(SHM_DIR, name))
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != me:
            continue
        if name.startswith(COPY_PREFIX):
            copies.append(name)
            continue
        made_by = maker(name)
        if made_by is None or process_start(made_by[0]) == made_by[1]:  # not ours, or still running
            continue
        if remove_segment(name):
            removed.append(name)
    if copies:
        used = in_use_by_me()
        for name in copies:
            if os.path.join(SHM_DIR, name) not in used and remove_segment(name):
                removed.append(name)
    return removed


__all__ = ["COPY_PREFIX", "PREFIX", "SHM_DIR", "create_segment", "identity", "maker", "new_name", "not_ours",
           "in_use_by_me", "open_segment", "remove_segment", "segment_path", "sweep"]
