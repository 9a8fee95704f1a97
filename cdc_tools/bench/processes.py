"""What the bench's processes use: peak memory, and CPU per role over a time window.

One thread samples this process and all its descendants (Airflow's services, the executor's
workers and their task processes, the Connect server) every `every` seconds: each one's RSS
(for the peak) and its CPU time, its own and that of its children it has reaped.

CPU is told per role, so that a cycle shows where its seconds went. A task process lives about
a second, under the sampler's resolution: its CPU is counted when it ends, from the reaped-
children time of the executor's worker that ran it (the Task SDK's supervisor). So a process
that ended inside the window counts through its parent, never by its own last sample as well;
one alive at the window's end counts its own CPU since the window's start. The window's ends
fall on samples (the last at or before its start, the first at or after its end): the figures
are good to about a sample's interval of the machine's cores at each end.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

SUPERVISORS, TASKS = "supervisors", "task_processes"
# Roles, by the process title Airflow or the JVM gives each process (else its parent's role).
ROLE_TITLES = (
    (SUPERVISORS, ("airflow worker -- LocalExecutor", "airflow supervisor:")),
    ("scheduler", ("airflow scheduler",)),
    ("api_server", ("api_server", "api-server")),
    ("dag_processor", ("dag-processor", "dag_processor")),
    ("triggerer", ("airflow triggerer",)),
)


@dataclass(frozen=True)
class Usage:
    """One process at one sample: its role, and its CPU seconds (own, and reaped children's)."""

    role: str
    own: float
    children: float


def role_of(command: list[str], parent_role: str | None) -> str:
    """A process's role: a supervisor's child and everything a task process starts (in
    spark-submit mode its Spark driver's JVM) is the task's, else by its title (a JVM is the
    Connect server), else its parent's ('other' for the bench's own helpers)."""
    if parent_role in (SUPERVISORS, TASKS):
        return TASKS
    title = " ".join(command)
    for role, marks in ROLE_TITLES:
        if any(mark in title for mark in marks):
            return role
    program = command[0].rsplit("/", 1)[-1] if command else ""
    if program == "java":
        return "connect_server"
    return parent_role or "other"


class ProcessSampler:
    """Peak RSS of this process and all its descendants, and their CPU by role, sampled every
    `every` seconds in a thread.

    RSS counts shared pages once per process, so the sum overstates real use a little; it is the
    same measure for both modes.
    """

    def __init__(self, every: float = 1.0, exclude: frozenset[int] = frozenset()) -> None:
        self.every = every
        self.exclude = exclude  # pids left out: the Kafka broker, an outside service in real use
        self.peak_mib = 0.0
        self.peak_top: list[dict[str, Any]] = []
        self.samples: list[tuple[float, float]] = []
        # (wall time, the machine's busy and stolen CPU seconds, each process's usage by (pid,
        # start))
        self.cpu: list[tuple[float, float, float, dict[tuple[int, float], Usage]]] = []
        # A process's role by (pid, start), with the command it was told from (exec changes it).
        self._roles: dict[tuple[int, float], tuple[list[str], str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def _sample(self) -> tuple[float, list[dict[str, Any]]]:
        import psutil

        me = psutil.Process()
        seen: dict[int, tuple[Any, ...]] = {}
        for process in [me, *me.children(recursive=True)]:
            if process.pid in self.exclude:
                continue
            try:
                with process.oneshot():
                    seen[process.pid] = (
                        process.memory_info().rss / 2**20,
                        process.cmdline(),
                        process.ppid(),
                        process.cpu_times(),
                        process.create_time(),
                    )
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        usage: dict[tuple[int, float], Usage] = {}
        sizes = []
        for pid, (rss, command, parent, times, started) in seen.items():
            usage[(pid, started)] = Usage(
                self._role(pid, seen, me.pid),
                times.user + times.system,
                times.children_user + times.children_system,
            )
            # A fork that has not exec'd yet (the JVM forks for each `chmod` Hadoop runs on a
            # local file system) shows its parent's pages and command line: not memory of its own.
            if parent in seen and seen[parent][1] == command:
                continue
            name = " ".join(command[:4])[-80:]
            sizes.append({"pid": pid, "command": name, "mib": round(rss, 1)})
        machine = psutil.cpu_times()
        # Busy: what this machine's processes ran (guest time is within user time already);
        # steal: what the host gave other machines while ours waited.
        busy = sum(getattr(machine, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
        self.cpu.append((time.time(), busy, getattr(machine, "steal", 0.0), usage))
        return sum(s["mib"] for s in sizes), sizes

    def _role(self, pid: int, seen: dict[int, tuple[Any, ...]], bench: int) -> str:
        """The role of `pid` (its parent's resolved first), kept while its command stays the same
        once it has a title of its own (a fresh fork shows its parent's until it sets one or
        execs; `spark-submit` execs the JVM under the same pid)."""
        key, command = (pid, seen[pid][4]), seen[pid][1]
        known = self._roles.get(key)
        if known is not None and known[0] == command:
            return known[1]
        parent = seen[pid][2]
        parent_role = self._role(parent, seen, bench) if parent in seen else None
        role = "bench" if pid == bench else role_of(command, parent_role)
        if parent not in seen or seen[parent][1] != command:
            self._roles[key] = (command, role)
        return role

    def _run(self) -> None:
        while not self._stop.is_set():
            total, sizes = self._sample()
            self.samples.append((round(time.monotonic() - self._started, 1), round(total, 1)))
            if total > self.peak_mib:
                self.peak_mib = total
                self.peak_top = sorted(sizes, key=lambda s: -s["mib"])[:6]
            self._stop.wait(self.every)

    def cpu_between(self, start: float, end: float) -> dict[str, Any] | None:
        """CPU seconds per role between two wall times (`time.time()`), the sum of ours, the
        whole machine's (outside processes too), its busy cores and the CPU time its host
        stole; None without samples."""
        deadline = time.time() + 3 * self.every
        while self._thread.is_alive() and (not self.cpu or self.cpu[-1][0] < end):
            if time.time() > deadline:
                break
            time.sleep(0.05)
        samples = list(self.cpu)
        before = [s for s in samples if s[0] <= start]
        after = [s for s in samples if s[0] >= end]
        if not before or not after:
            return None
        (t0, busy0, steal0, first), (t1, busy1, steal1, last) = before[-1], after[0]
        roles: dict[str, float] = {}
        for key, now in last.items():
            then = first.get(key)
            own = now.own - (then.own if then else 0.0)
            reaped = now.children - (then.children if then else 0.0)
            roles[now.role] = roles.get(now.role, 0.0) + own
            # A child that ended in the window: its CPU reached its parent when it was reaped.
            into = TASKS if now.role == SUPERVISORS else now.role
            roles[into] = roles.get(into, 0.0) + reaped
        ours = sum(roles.values())
        return {
            "window_seconds": round(t1 - t0, 1),
            "cpu_seconds": {role: round(seconds, 1) for role, seconds in sorted(roles.items())},
            "ours_cpu_seconds": round(ours, 1),
            "machine_cpu_seconds": round(busy1 - busy0, 1),
            "machine_steal_seconds": round(steal1 - steal0, 1),
            "cores_busy": round((busy1 - busy0) / (t1 - t0), 2) if t1 > t0 else None,
        }

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
