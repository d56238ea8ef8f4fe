"""Writing files so that a crash or a kill never leaves half of one behind."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile

from .errors import BabyGPTError

# What to do about the filesystem errors a user can fix; any other OSError is a bug.
FIXES = {
    errno.ENOSPC: "free some disk space",
    errno.EDQUOT: "free some space within your disk quota",
    errno.EACCES: "choose a location you can write to, or fix its permissions",
    errno.EPERM: "choose a location you can write to, or fix its permissions",
    errno.EROFS: "the filesystem is read-only: choose a location on a writable one",
    errno.ENAMETOOLONG: "use a shorter name",
    errno.EISDIR: "that path is a directory: give a file name",
    errno.ENOTDIR: "a part of that path is a file, not a directory: fix the path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
    errno.ENOENT: "a directory on that path does not exist and cannot be made there: fix the path",
    errno.EEXIST: "something is already there (e.g. a dangling symlink): choose another path",
    errno.ELOOP: "the path goes through a symlink loop: fix the path",
    errno.EIO: "the disk or filesystem reported an input/output error: check it (e.g. dmesg), then run the "
               "command again",
}


def existing_ancestor(path: str) -> str:
    """The nearest part of ``path`` (absolute; itself included) that exists: where it would be created."""
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    return ancestor


def path_problem(path: str) -> str | None:
    """Why the filesystem could not hold ``path`` ("'x' has a name of 300 bytes, ..."), or None."""
    if "\0" in path:
        return f"{path!r} contains a NUL byte"
    def limit(name: str, default: int) -> int:
        try:
            return os.pathconf("/", name)
        except (OSError, ValueError, AttributeError):
            return default
    whole = os.fsencode(os.path.abspath(path))  # bytes as the OS sees them, even for undecodable names
    if len(whole) >= limit("PC_PATH_MAX", 4096):
        return f"{path!r} is {len(whole)} bytes long, longer than the filesystem's limit"
    longest = max(len(part) for part in whole.split(os.fsencode(os.sep)))
    if longest > limit("PC_NAME_MAX", 255):
        return f"{path!r} has a name of {longest} bytes, longer than the filesystem's limit"
    return None


def os_error_message(e: OSError, path: str | None = None, doing: str = "writing") -> str | None:
    """``cannot write 'out/ckpt.pt': No space left on device; free some disk space`` for an error
    the user can fix, None for any other."""
    fix = FIXES.get(e.errno)
    if fix is None:
        return None
    where = path or e.filename
    where = f" '{where}'" if where else ""
    return f"{doing}{where} failed: {e.strerror or e}; {fix}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _WatchedWrites:
    """A binary file whose ``write`` keeps the first OSError it raised (a full disk, say): torch.save
    writes through a C++ writer that replaces that error with a RuntimeError saying only "unexpected
    pos ..." or "PytorchStreamWriter failed writing file ...", so it must be caught on its way."""

    def __init__(self, file):
        self._file = file
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name):
        return getattr(self._file, name)


# What torch's C++ zip writer says when a write fails (it hides the OSError, if there was one).
TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed writing", "unexpected pos", "file write failed")


def write_failure(e: BaseException, watched: _WatchedWrites | None) -> OSError | str | None:
    """Why writing failed, if ``e`` says it did: the OSError itself, or the one torch's writer hid
    behind its RuntimeError (else that RuntimeError's first line); None for any other exception."""
    if isinstance(e, OSError):
        return e
    if isinstance(e, RuntimeError):
        if watched is not None and watched.error is not None:
            return watched.error
        if any(text in str(e) for text in TORCH_WRITE_FAILURES):
            return (str(e).strip().splitlines() or [""])[0][:160]
    return None


@contextlib.contextmanager
def atomic_open(path: str):
    """Yield a binary file that replaces ``path`` only once fully written.

    The data goes to a temporary file in the same directory (so the final rename
    stays on one filesystem), is flushed and fsynced, then ``os.replace``d over
    ``path``: readers see the old file or the new one, never a partial one. On
    any error, the temporary file is removed and ``path`` is untouched. A write that
    fails (a full disk, also inside torch.save) is a BabyGPTError naming ``path``.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:  # the name is capped so that a long file name still leaves room for the prefix
        before = os.stat(directory)  # (its times, put back if the write fails: the temporary file changed them)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix="-" + os.path.basename(path)[:100])
    except OSError as e:
        raise user_error(e, path) from None
    watched, replaced = None, False
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        with os.fdopen(fd, "wb") as f:
            watched = _WatchedWrites(f)
            yield watched
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        replaced = True
        dir_fd = os.open(directory, os.O_RDONLY)  # make the rename itself survive a power loss
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
            _put_back_times(directory, before)
        failure = write_failure(e, watched)
        if failure is None:
            raise
        # e.g. a full disk: say which file, and whether the old one is whole
        note = f" (the new {path} is in place, but its rename may not survive a power loss)" if replaced \
            else f" ({path} is unchanged)"
        if isinstance(failure, OSError):
            raise user_error(failure, path, note, original=e) from None
        raise BabyGPTError(f"writing '{path}' failed: {failure}; free some disk space, or choose a location on "
                           f"another disk{note}") from None


def _put_back_times(directory: str, before: os.stat_result) -> None:
    """Give ``directory`` its access and modification times of ``before`` again (a failed write made
    and removed a file there, and left nothing else), as far as the filesystem lets us."""
    try:
        os.utime(directory, ns=(before.st_atime_ns, before.st_mtime_ns))
    except OSError:
        pass  # (a read-only or foreign directory: the failure's own message matters more)


def user_error(e: OSError, path: str, note: str = "", original: BaseException | None = None) -> BaseException:
    """A BabyGPTError naming ``path`` and the fix, for an error the user can fix; ``original``
    (default ``e`` itself) otherwise."""
    message = os_error_message(e, path)
    return BabyGPTError(message + note) if message else (original or e)


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (see atomic_open)."""
    with atomic_open(path) as f:
        f.write(data)


def output_file_problems(path: str, option: str, formats: tuple[str, ...] | None = None) -> list[str]:
    """What would stop a command from writing its result to ``path`` (checked before the work):
    a directory or a missing extension instead of a file name, a format ``formats`` lacks, a
    parent that is a file, or a place this user cannot write."""
    if not path.strip():
        return [f"{option} is empty; give a file name"]
    if os.path.isdir(path):
        return [f"{option} '{path}' is a directory; give a file name inside it"]
    extension = os.path.splitext(path)[1].lower().lstrip(".")
    if formats is not None and extension not in formats:
        what = f"format '.{extension}' is not supported" if extension else "has no extension"
        return [f"{option} '{path}': {what}; end the name with one of: {', '.join('.' + f for f in formats)}"]
    problem = path_problem(path)
    if problem:
        return [f"{option} {problem}; use a shorter name"]
    ancestor = existing_ancestor(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(ancestor):
        return [f"{option} '{path}' cannot be created: '{ancestor}' is a file; fix the path"]
    if not os.access(ancestor, os.W_OK):
        return [f"{option} '{path}' cannot be written: '{ancestor}' is read-only to you; choose another place"]
    return []


def write_csv(path: str, fieldnames: list[str], rows: list[dict]) -> None:
    """Replace ``path`` atomically with a CSV table of ``rows`` (dicts; keys beyond ``fieldnames``
    are left out), so that a failed write leaves the previous table whole."""
    import csv
    import io

    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fieldnames, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, text.getvalue().encode("utf-8"))
