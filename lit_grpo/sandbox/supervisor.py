"""The child side of one sandboxed call, run as a script (``python -I supervisor.py CONFIG``, the code on stdin) by
``sandbox/runner.py``: stdlib only, it imports nothing of lit_grpo (the environment it starts in is empty).

What it does, in order:

1. Namespaces (``isolation: "namespaces"``): ``unshare`` of mount, network, PID, IPC and UTS namespaces, and of a
   user namespace (its own uid mapped to itself: the code has no capability outside it). It forks; the child is
   PID 1 of the new PID namespace (when it ends the kernel kills every process in it), makes the whole filesystem
   read-only except the scratch directory, and mounts a ``/proc`` that shows only the namespace's processes. The
   new network namespace has only a loopback device, down: no address, not even 127.0.0.1, is reachable.
   Without namespaces (``isolation: "none"``) it makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): every
   orphan the code leaves, including one that called ``setsid()``, is re-parented to it, so it can find and kill it.
2. It forks the code's process: working directory the scratch directory, resource limits set (address space, CPU
   time, processes, file size, open files, no core files), then ``exec`` of the interpreter on the code. As root
   ``RLIMIT_NPROC`` does not bind: the runner's pids cgroup (``sandbox/pids.py``), joined here first, does.
3. It watches until that process ends or the wall time passes, every ``POLL`` s summing its descendants' resident
   memory, counting them, and (less often) the scratch directory's bytes: a limit passed ends the call.
4. It kills every descendant still there (``stragglers``) and writes one JSON line on the status descriptor:
   ``{"status", "detail", "stragglers"}``.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import time

POLL = 0.02  # seconds between two looks at the code's processes
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
LIBC = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def checked(what: str, result: int) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def mount(source: str | None, target: str, kind: str | None, flags: int) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    checked(f"mount {target}", LIBC.mount(encode(source), encode(target), encode(kind), ctypes.c_ulong(flags), None))


def set_read_only(path: str, read_only: bool) -> None:
    """``mount_setattr(2)``: every mount under ``path`` read-only, or writable again."""
    attr = MountAttr(MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    checked(f"mount_setattr {path}", LIBC.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE,
                                                   ctypes.byref(attr), ctypes.sizeof(attr)))


def enter_namespaces() -> None:
    """New user (this uid mapped to itself), mount, network, PID, IPC and UTS namespaces; the caller forks next."""
    uid, gid = os.geteuid(), os.getegid()
    checked("unshare", LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC |
                                    CLONE_NEWUTS))
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)


def seal_filesystem(scratch: str) -> None:
    """(PID 1 of the new namespaces) everything read-only but ``scratch``; a ``/proc`` of this namespace only."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount(scratch, scratch, None, MS_BIND | MS_REC)
    set_read_only("/", True)
    set_read_only(scratch, False)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def process_table() -> dict[int, tuple[int, str, int]]:
    """Every visible process: ``pid -> (parent pid, state, resident bytes)``."""
    table, page = {}, os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            table[int(name)] = (int(fields[1]), fields[0], int(fields[21]) * page)
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return table


def descendants(table: dict[int, tuple[int, str, int]]) -> list[int]:
    """This process's living descendants (zombies left out), breadth first."""
    children: dict[int, list[int]] = {}
    for pid, (parent, state, _) in table.items():
        if state != "Z":
            children.setdefault(parent, []).append(pid)
    found, frontier = [], [os.getpid()]
    while frontier:
        found.extend(kids := [kid for pid in frontier for kid in children.get(pid, [])])
        frontier = kids
    return found


def reap() -> dict[int, int]:
    """Wait statuses of the children that ended (orphans re-parented here included)."""
    ended = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended[pid] = status


def kill_all() -> int:
    """SIGKILL every descendant until none is left (a fork bomb's children are bounded by RLIMIT_NPROC, and a killed
    process forks no more); how many there were at the first look."""
    first = None
    for _ in range(1000):
        alive = descendants(process_table())
        first = len(alive) if first is None else first
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)
        reap()
    return first or 0


def scratch_bytes(scratch: str) -> int:
    total = 0
    for root, _, files in os.walk(scratch):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def start_code(config: dict, code_fd: int) -> int:
    """Fork the code's process: limits set, then ``exec`` of the interpreter on the code (its stdin)."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.dup2(code_fd, 0)
        os.chdir(config["scratch"])
        limits = config["limits"]
        cpu = int(limits["cpu_seconds"])
        for kind, value in ((resource.RLIMIT_AS, limits["memory_bytes"]), (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                            (resource.RLIMIT_NPROC, limits["processes"]), (resource.RLIMIT_CORE, 0),
                            (resource.RLIMIT_FSIZE, limits["file_bytes"]),
                            (resource.RLIMIT_NOFILE, limits["open_files"])):
            resource.setrlimit(kind, value if isinstance(value, tuple) else (value, value))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.execve(config["interpreter"], [config["interpreter"], "-I", "-u", "-"], config["environment"])
    except BaseException as error:  # noqa: BLE001 - the code never started: say why, in its output
        os.write(2, f"the sandbox could not start the code: {type(error).__name__}: {error}\n".encode())
    os._exit(127)


def supervise(config: dict, code_fd: int) -> dict:
    """Run the code's process to its end or a limit's; kill what is left; the status to report."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # the runner stops the call (its output cap)
    limits = config["limits"]
    child = start_code(config, code_fd)
    deadline, looks, status, detail = time.monotonic() + limits["wall_seconds"], 0, None, ""
    while status is None:
        ended = reap()
        if child in ended:
            code = ended[child]
            if os.WIFSIGNALED(code):
                number = os.WTERMSIG(code)
                status, detail = "signal", f"was killed by signal {signal.Signals(number).name}"
                if number == signal.SIGXCPU:
                    status, detail = "cpu", f"passed its CPU time limit of {limits['cpu_seconds']:g} s"
            elif os.WEXITSTATUS(code):
                status, detail = "exit", f"exited with status {os.WEXITSTATUS(code)}"
            else:
                status = "ok"
            break
        if stop:
            status, detail = "stopped", "was stopped"
            break
        if time.monotonic() > deadline:
            status, detail = "timeout", f"ran past its wall time of {limits['wall_seconds']:g} s"
            break
        alive = descendants(table := process_table())
        resident = sum(table[pid][2] for pid in alive if pid in table)
        looks += 1
        if len(alive) > limits["processes"]:
            status, detail = "processes", f"started more than {limits['processes']} processes"
        elif resident > limits["memory_bytes"]:
            status, detail = "memory", f"used more than {limits['memory_bytes']} bytes of memory in all"
        elif looks % 10 == 0 and scratch_bytes(config["scratch"]) > limits["scratch_bytes"]:
            status, detail = "disk", f"wrote more than {limits['scratch_bytes']} bytes in its scratch directory"
        else:
            time.sleep(POLL)
    stragglers = kill_all()
    if status == "ok" and stragglers:
        status, detail = "stragglers", f"left {stragglers} process(es) running after it ended (killed)"
    return {"status": status, "detail": detail, "stragglers": stragglers}


def report(config: dict, status: dict) -> None:
    os.write(config["status_fd"], (json.dumps(status) + "\n").encode())


def main() -> None:
    config = json.loads(sys.argv[1])
    if config["cgroup"]:  # the runner's pids cgroup: every process of this call is in it
        with open(config["cgroup"], "w") as handle:
            handle.write(str(os.getpid()))
    code = sys.stdin.buffer.read()
    code_fd = os.memfd_create("cell", 0)  # the code as the interpreter's stdin (any length; no file to see)
    os.write(code_fd, code)
    os.lseek(code_fd, 0, os.SEEK_SET)
    checked("prctl", LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL))  # the runner gone: this call is over
    if config["isolation"] == "namespaces":
        try:
            enter_namespaces()
        except OSError as error:
            report(config, {"status": "setup", "detail": f"could not enter namespaces: {error}", "stragglers": 0})
            return
        pid = os.fork()
        if pid:  # outside the namespaces: end as PID 1 ends (killed by the runner: PID 1 and all its own die too)
            _, code = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(code) & 0xFF)
        checked("prctl", LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL))
        try:
            seal_filesystem(config["scratch"])
        except OSError as error:
            report(config, {"status": "setup", "detail": f"could not seal the filesystem: {error}", "stragglers": 0})
            os._exit(0)
    else:
        checked("prctl", LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1))
    if config.get("probe"):
        report(config, {"status": "ok", "detail": "", "stragglers": 0})
    else:
        report(config, supervise(config, code_fd))
    os._exit(0)


if __name__ == "__main__":
    main()
