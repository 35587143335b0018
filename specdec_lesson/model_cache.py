"""The converted-model cache (the default target's fp32 copy): a safe conversion and a cheap check at each load.

Where
    ``$SPECDEC_CACHE`` or ``~/.cache/specdec_lesson``, one folder per converted model.

Conversion (``ensure_converted``)
    Before the long work: the cache folder must be writable and have room.  Then, under an exclusive lock
    file (``fcntl.flock``), so that a second process starting at the same time waits and then uses the
    first one's result instead of converting again (and removing the folder the first one loads from):
    leftovers of killed conversions are removed (SIGKILL runs no ``finally``: the temporary folder is
    named ``<name>.tmp-<pid>-<ns>`` and removed once that pid is dead, or after an hour since pids are
    reused), the new copy is written into a temporary folder, its manifest recorded, and the folder
    renamed into place only when complete.

Manifest (``specdec_manifest.json``)
    ``version``, ``source`` and ``files`` (name -> size, the format older code reads), plus per file its
    full ``sha256``, its ``mtime_ns``, and for large files ``samples``: the sha256 of 32 chunks of 64 KiB
    spread over the file.

Check at each load (``check_cache``)
    Every file's size; small files' full sha256; for large files the safetensors header (it parses and
    its offsets cover the file exactly) and the sampled chunks: a few MiB read, milliseconds.  The full
    sha256 of a large file (about 1 s for 540 MB) runs when its mtime differs from the recorded one, so
    any write through the file system (a same-size overwrite included) is caught; when it still matches
    (a copy, a ``touch``) the new mtime is recorded.  A manifest from before the hashes were recorded
    (sizes only) gets them once, recorded when the folder is writable.  Damage that changes neither
    mtime nor a sampled chunk is not detected (the price of not hashing 540 MB at every load).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["MANIFEST", "cache_root", "write_manifest", "check_cache", "ensure_converted", "CacheError"]

MANIFEST = "specdec_manifest.json"
VERSION = 1  # unchanged: the hashes are extra keys, so older code still reads these manifests
FULL_HASH_BELOW = 16 * 2**20  # files smaller than this are fully hashed at every load
SAMPLES, SAMPLE_BYTES = 32, 2**16
STALE_AFTER_S = 3600.0


class CacheError(RuntimeError):
    """The cache folder cannot be written (or has no room): raised before any conversion work."""


def cache_root() -> Path:
    """Where converted weights live: ``$SPECDEC_CACHE`` or ``~/.cache/specdec_lesson``."""
    env = os.environ.get("SPECDEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdec_lesson"


# ------------------------------------------------------------------------------------ hashing
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _sample_sha256(path: Path, size: int) -> str:
    """sha256 over ``SAMPLES`` chunks at fixed offsets (the first and the last included)."""
    n = max(1, min(SAMPLE_BYTES, size // SAMPLES))
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for i in range(SAMPLES):
            fh.seek(round(i * (size - n) / (SAMPLES - 1)))
            h.update(fh.read(n))
    return h.hexdigest()


def _safetensors_problem(path: Path, size: int) -> str | None:
    """None if the safetensors header parses and its tensors cover the file exactly, else what is wrong."""
    with path.open("rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n <= 1 or 8 + n > size or n > 100 * 2**20:
            return f"its header length field ({n}) does not fit the file ({size} bytes)"
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "its header is not valid JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        off = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(off, list) and len(off) == 2 and all(isinstance(o, int) for o in off) and 0 <= off[0] <= off[1]):
            return f"its header entry {key!r} is malformed"
        end = max(end, off[1])
    if 8 + n + end != size:
        return f"its header describes {8 + n + end} bytes, the file has {size}"
    return None


def _describe(folder: Path, name: str) -> dict:
    path = folder / name
    st = path.stat()
    d = {"sha256": _sha256(path), "mtime_ns": st.st_mtime_ns}
    if st.st_size >= FULL_HASH_BELOW:
        d["samples"] = _sample_sha256(path, st.st_size)
    return d


def _save_manifest(folder: Path, manifest: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=folder)  # unique: concurrent loads may upgrade
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(manifest, indent=1))
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / MANIFEST)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_manifest(folder: Path, source: str | None = None) -> None:
    """Record every file of ``folder``: size, sha256, mtime (and sampled chunks for large files)."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())
             if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")}
    manifest = {"version": VERSION, "source": source, "files": files,
                "hashes": {name: _describe(folder, name) for name in files}}
    _save_manifest(folder, manifest)


# ---------------------------------------------------------------------------------- checking
def check_cache(folder: Path) -> str | None:
    """None if ``folder`` is a complete, unchanged conversion, else what is wrong with it (one phrase)."""
    mpath = folder / MANIFEST
    if not mpath.is_file():
        return "it has no manifest (an interrupted or foreign conversion)"
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"its manifest is unreadable ({exc})"
    if not isinstance(manifest, dict) or manifest.get("version") != VERSION:
        version = manifest.get("version") if isinstance(manifest, dict) else None
        return f"it was written by cache version {version}, expected {VERSION}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not any(name.endswith(".safetensors") for name in files):
        return "its manifest lists no weight file"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"the file {name} is missing"
        if path.stat().st_size != size:
            return f"the file {name} has {path.stat().st_size} bytes, the manifest says {size} (truncated or changed)"
        if name.endswith(".safetensors"):
            problem = _safetensors_problem(path, size)
            if problem:
                return f"the file {name} is corrupt: {problem}"
    hashes = manifest.get("hashes")
    if not isinstance(hashes, dict) or set(hashes) != set(files):  # a manifest of sizes only: hash once
        manifest["hashes"] = {name: _describe(folder, name) for name in files}
        with contextlib.suppress(OSError):
            _save_manifest(folder, manifest)
        return None
    changed = False
    for name, size in files.items():
        path, want = folder / name, hashes[name]
        differs = f"the file {name} is not the one the conversion wrote (its sha256 differs: corrupted or modified)"
        if "samples" not in want:
            if _sha256(path) != want.get("sha256"):
                return differs
            continue
        if _sample_sha256(path, size) != want["samples"]:
            return differs
        mtime = path.stat().st_mtime_ns
        if mtime != want.get("mtime_ns"):  # written since the conversion (or copied): hash it all
            if _sha256(path) != want.get("sha256"):
                return differs
            want["mtime_ns"], changed = mtime, True
    if changed:
        with contextlib.suppress(OSError):
            _save_manifest(folder, manifest)
    return None


# -------------------------------------------------------------------------------- conversion
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _remove_stale(dest: Path) -> list[Path]:
    """Temporary folders of killed conversions next to ``dest`` (their pid dead, or over an hour old)."""
    removed = []
    for p in dest.parent.glob(f"{dest.name}.tmp-*"):
        try:
            pid = int(p.name.rsplit(".tmp-", 1)[1].split("-")[0])
        except (IndexError, ValueError):
            pid = -1
        try:
            age = time.time() - p.stat().st_mtime
        except OSError:  # removed meanwhile
            continue
        if pid == os.getpid() or pid < 0 or not _pid_alive(pid) or age > STALE_AFTER_S:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


@contextlib.contextmanager
def _locked(path: Path, verbose: bool):
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if verbose:
                print(f"[specdec] another process is converting into {path.parent}; waiting for it ...", flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_writable(root: Path, need_bytes: int) -> None:
    fix = "fix: set SPECDEC_CACHE to a writable folder with room (or make this one writable)"
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=root)  # a unique name: concurrent checks do not collide
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CacheError(f"the model cache folder {root} is not writable ({exc.strerror or exc}); the first load converts "
                         f"the default target into it; {fix}") from None
    free = shutil.disk_usage(root).free
    if free < need_bytes:
        raise CacheError(f"the model cache folder {root} has {free / 1e6:.0f} MB free; the conversion needs about "
                         f"{need_bytes / 1e6:.0f} MB; {fix}")


def ensure_converted(dest: Path, convert: Callable[[Path], None], *, source: str | None = None, need_bytes: int = 0,
                     verbose: bool = True) -> bool:
    """Make ``dest`` with ``convert(tmp_folder)`` unless it exists; True if this call converted.
    Raises CacheError (before any conversion work) if the cache folder cannot take it."""
    if dest.exists():
        return False
    _check_writable(dest.parent, need_bytes)
    with _locked(dest.parent / f".{dest.name}.lock", verbose):
        if dest.exists():  # another process finished it while this one waited
            return False
        for p in _remove_stale(dest):
            if verbose:
                print(f"[specdec] removed {p.name}, left by an interrupted conversion", flush=True)
        _check_writable(dest.parent, need_bytes)  # room again, now that leftovers are gone
        tmp = dest.parent / f"{dest.name}.tmp-{os.getpid()}-{time.time_ns()}"
        try:
            convert(tmp)
            write_manifest(tmp, source)
            os.rename(tmp, dest)  # atomic on one file system: the cache appears complete or not at all
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return True
