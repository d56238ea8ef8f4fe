"""Writing files so that a crash or a kill never leaves half of one behind."""

from __future__ import annotations

import contextlib
import os
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str):
    """Yield a binary file that replaces ``path`` only once fully written.

    The data goes to a temporary file in the same directory (so the final rename
    stays on one filesystem), is flushed and fsynced, then ``os.replace``d over
    ``path``: readers see the old file or the new one, never a partial one. On
    any error, the temporary file is removed and ``path`` is untouched.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix="-" + os.path.basename(path))
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(directory, os.O_RDONLY)  # make the rename itself survive a power loss
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (see atomic_open)."""
    with atomic_open(path) as f:
        f.write(data)
