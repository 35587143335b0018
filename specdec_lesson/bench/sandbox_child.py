"""The child half of ``sandbox``: confine this process, run one HumanEval program, report.

Run as a script by ``sandbox._run`` (``python -I sandbox_child.py NONCE_FD RESULT_FD ROOT ENTRY_POINT CPU_S``),
so it imports the standard library only.  It reads the nonce and closes its pipe, confines itself
(namespaces, resource limits, a seccomp filter against new processes, Landlock, then the guard) and
writes ``P <layers applied>`` to RESULT_FD; it runs ``ROOT/check.py`` (the reply and the tests), calls
``check(ENTRY_POINT)``, and only when that returned writes ``N <nonce>``.  Every step that the kernel
refuses is skipped, not fatal: the parent notes what is missing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import stat
import struct
import sys

OUTPUT_KEEP = 64 * 1024  # bytes of the child's output the bench keeps
MEMORY_BYTES = 1 << 30  # RLIMIT_AS
FILE_BYTES = 16 << 20  # RLIMIT_FSIZE
PROTECTIONS = ("user-namespace", "network-namespace", "pid-namespace", "no-new-processes", "landlock-files",
               "landlock-tcp", "landlock-signals")
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET, _CLONE_THREAD = 0x10000000, 0x20000000, 0x40000000, 0x00010000
# seccomp: audit arch, clone, clone3, then the calls refused outright (fork, vfork, execve, execveat)
_SYSCALLS = {"x86_64": (0xC000003E, 56, 435, (57, 58, 59, 322)), "aarch64": (0xC00000B7, 220, 435, (221, 281))}


def _call(fn, *args: int | bytes | None) -> int:
    """A variadic libc call with every argument a full machine word."""
    return fn(*(ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_void_p(a) for a in args))


def _namespaces(libc) -> list[str]:
    """New user + network + PID namespaces; returns in the namespace's PID 1 (the caller waits for it)."""
    uid, gid = os.getuid(), os.getgid()
    for flags in (_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID, _CLONE_NEWUSER | _CLONE_NEWNET):
        if _call(libc.unshare, flags) == 0:
            break
    else:
        return []
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:  # keep our ids: files created stay ours
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError:
            pass
    if not flags & _CLONE_NEWPID:
        return ["user-namespace", "network-namespace"]
    child = os.fork()
    if child:  # when the namespace's PID 1 exits, the kernel kills every process left in it
        code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        os._exit(128 - code if code < 0 else code)  # a signal as a shell says it
    return ["user-namespace", "network-namespace", "pid-namespace"]


def _limits(cpu_s: int) -> None:
    import resource

    for which, value in ((resource.RLIMIT_AS, MEMORY_BYTES), (resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_FSIZE, FILE_BYTES),
                         (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def _seccomp(libc) -> list[str]:
    """No new processes (threads are fine) and no exec, for root too (RLIMIT_NPROC spares root)."""
    if platform.machine() not in _SYSCALLS:
        return []
    arch, clone, clone3, refused = _SYSCALLS[platform.machine()]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, eperm),  # another ABI: refused
            (0x20, 0, 0, 0), (0x35, 0, 1, 0x40000000), (0x06, 0, 0, eperm),  # x32 numbers: refused
            (0x15, 0, 1, clone3), (0x06, 0, 0, enosys),  # glibc falls back to clone
            *[x for nr in refused for x in ((0x15, 0, 1, nr), (0x06, 0, 0, eperm))],
            (0x15, 1, 0, clone), (0x06, 0, 0, allow),
            (0x20, 0, 0, 16), (0x45, 1, 0, _CLONE_THREAD), (0x06, 0, 0, eperm), (0x06, 0, 0, allow)]  # clone: threads only
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *x) for x in prog))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(filters))
    _call(libc.prctl, 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    return ["no-new-processes"] if _call(libc.prctl, 22, 2, fprog, 0, 0) == 0 else []  # PR_SET_SECCOMP, FILTER


def _landlock(libc, root: str) -> list[str]:
    """Read only Python's and the system's library folders, write only under ``root``; no TCP, no signals out."""
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    abi = _call(syscall, 444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return []
    read = 1 | 4 | 8  # EXECUTE, READ_FILE, READ_DIR
    fs_all = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    file_rights = 1 | 2 | 4 | 1 << 14 | 1 << 15  # what a rule on a file (not a folder) may grant
    net, scoped = (3 if abi >= 4 else 0), (3 if abi >= 6 else 0)  # TCP bind + connect; abstract unix sockets + signals
    attr = struct.pack("QQQ", fs_all, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _call(syscall, 444, attr, len(attr), 0)
    if ruleset < 0:
        return []
    paths = [(p, read) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, "/usr", "/lib", "/lib64", "/bin"}]
    for path, access in [*paths, (root, fs_all), ("/dev/null", 2 | 4), ("/dev/urandom", 4)]:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= file_rights
        _call(syscall, 445, ruleset, 1, struct.pack("=Qi", access & fs_all, fd), 0)  # LANDLOCK_RULE_PATH_BENEATH
        os.close(fd)
    _call(libc.prctl, 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: Landlock's condition without CAP_SYS_ADMIN
    ok = _call(syscall, 446, ruleset, 0) == 0  # landlock_restrict_self
    os.close(ruleset)
    return ["landlock-files"] + ["landlock-tcp"] * bool(net) + ["landlock-signals"] * bool(scoped) if ok else []


def _guard(files_confined: bool) -> None:
    """Disable HumanEval's ``reliability_guard`` functions and the exec/spawn family; file removal, renaming
    and mode changes too unless Landlock already keeps them inside the private folder (where
    ``tempfile.TemporaryDirectory`` needs them).  ``os.putenv`` stays: numpy calls it, the environment is private."""
    import builtins
    import posix
    import subprocess

    names = ["system", "popen", "fork", "forkpty", "kill", "killpg", "chroot", "setuid", "setgid", "setsid", "posix_spawn",
             "posix_spawnp", "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnv",
             "spawnve", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnvp", "spawnvpe"]
    if not files_confined:
        names += ["remove", "removedirs", "rmdir", "unlink", "rename", "renames", "replace", "truncate", "chmod", "fchmod",
                  "lchmod", "chown", "fchown", "lchown"]
        shutil.rmtree = shutil.move = shutil.chown = None  # type: ignore[assignment]
    for module in (os, posix):
        for name in names:
            if hasattr(module, name):
                setattr(module, name, None)
    subprocess.Popen = None  # type: ignore[assignment,misc]
    builtins.help = None  # type: ignore[assignment]
    for name in ("resource", "psutil", "_posixsubprocess", "multiprocessing", "ipdb", "joblib", "tkinter"):
        sys.modules[name] = None  # type: ignore[assignment]


class _Capped:
    """sys.stdout/sys.stderr: writes the first ``cap`` bytes to fd 1 and drops the rest (cap = OUTPUT_KEEP + 1:
    a file longer than OUTPUT_KEEP says that output was cut)."""

    encoding, errors = "utf-8", "replace"

    def __init__(self, cap: int) -> None:
        self.left, self._write = cap, os.write

    def write(self, text: str) -> int:
        if self.left <= 0:
            return len(text)
        data = str(text)[: self.left].encode("utf-8", "replace")[: self.left]
        self.left -= len(data)
        try:
            while data:
                data = data[self._write(1, data):]
        except OSError:  # the file-size limit, reached by raw writes
            self.left = 0
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def main(nonce_fd: int, result_fd: int, root: str, entry_point: str, cpu_s: int) -> None:
    import builtins
    import traceback

    nonce = os.read(nonce_fd, 64)
    os.close(nonce_fd)  # gone before the reply's code runs
    write, exit_ = os.write, os._exit
    libc = ctypes.CDLL(None, use_errno=True)
    applied = _namespaces(libc)
    _limits(cpu_s)
    applied += _seccomp(libc) + _landlock(libc, root)
    write(result_fd, b"P " + ",".join(applied).encode() + b"\n")
    path = os.path.join(root, "check.py")
    with open(path) as f:
        source = f.read()
    out = _Capped(OUTPUT_KEEP + 1)
    sys.stdout = sys.stderr = out  # type: ignore[assignment]
    program = {"__name__": "__sandbox__", "__builtins__": builtins}  # not "__main__": demo blocks stay out
    _guard("landlock-files" in applied)
    try:
        exec(compile(source, path, "exec"), program)
        program["check"](program[entry_point])
    except BaseException as e:  # SystemExit too: the tests did not finish
        why = f"exited before the tests finished (SystemExit({e.code!r}))" if isinstance(e, SystemExit) else \
            traceback.format_exception_only(e)[-1].strip()
        write(result_fd, b"F " + why.encode("utf-8", "replace")[:500].replace(b"\n", b" ") + b"\n")
        traceback.print_exc(file=out)
        exit_(1)
    write(result_fd, b"N " + nonce + b"\n")
    exit_(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
