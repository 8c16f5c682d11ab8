"""The session secret as a file that jobs read: never on a command line, never in the
environment of the job's launcher (``ps``, ``docker inspect``, ``squeue`` show those)."""

from __future__ import annotations

import os
import secrets
import tempfile
import threading


class SecretFiles:
    """One file per session holding its secret (hex), made with ``O_EXCL`` and ``mode``.

    ``directory``: where the files go (a shared spool every node sees, say); None makes a
    private one (mode 0700) on first use. Files are named ``secret-<session>-<random>``
    (:meth:`session_of` reads a name back). :meth:`close` removes the files this object made.
    """

    def __init__(self, directory: str | None = None, mode: int = 0o600, prefix: str = "fibercore-") -> None:
        self.directory = directory
        self.mode = mode
        self._prefix = prefix
        self._made: dict[str, str] = {}  # session -> path
        self._own_directory = False  # made here (directory None): removed by close()
        self._lock = threading.Lock()

    def path(self, session: str, secret_hex: str) -> str:
        """The file of ``session`` (written on first use)."""
        with self._lock:
            path = self._made.get(session)
            if path is None:
                if self.directory is None:
                    self.directory = tempfile.mkdtemp(prefix=self._prefix)
                    os.chmod(self.directory, 0o700)
                    self._own_directory = True
                path = os.path.join(self.directory, f"secret-{session}-{secrets.token_hex(4)}")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.mode)
                with os.fdopen(fd, "w") as fh:
                    fh.write(secret_hex)
                self._made[session] = path
            return path

    @property
    def sessions(self) -> set[str]:
        """The sessions whose file this object made (and has not removed)."""
        return set(self._made)

    @staticmethod
    def session_of(filename: str) -> str | None:
        """The session a file name of this kind belongs to (None: not such a file)."""
        if not filename.startswith("secret-"):
            return None
        session, _, token = filename[len("secret-"):].rpartition("-")
        return session or None if token else None

    def remove(self, session: str) -> None:
        """Remove the file of ``session`` (a later :meth:`path` writes a new one)."""
        with self._lock:
            path = self._made.pop(session, None)
        if path is not None:
            _unlink(path)

    def close(self) -> None:
        """Remove every file this object made, and the directory when it made that too."""
        with self._lock:
            paths, self._made = list(self._made.values()), {}
        for path in paths:
            _unlink(path)
        if self._own_directory and self.directory is not None:
            try:
                os.rmdir(self.directory)
            except OSError:  # not empty: something else put a file there
                pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
