"""``kgc tune --jobs K``: K worker processes on one study, each dying with its parent, signals forwarded."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading


def _die_with_parent() -> None:
    """In a worker, before it runs: SIGTERM when the parent dies, however it dies (Linux's PR_SET_PDEATHSIG; a
    SIGKILLed ``kgc tune --jobs`` leaves no worker training on)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


@contextlib.contextmanager
def _workers(argv: list[str], jobs: int):
    """``jobs`` worker processes of ``argv`` — each its own sampler seed, dying with this process — and a list that
    names the signal (SIGTERM, SIGINT) that stopped this process, forwarded to every worker, while they run."""
    stopped: list[str] = []
    procs = [subprocess.Popen(argv, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                                         "KGC_TUNE_WORKER": str(i)}, preexec_fn=_die_with_parent)
             for i in range(jobs)]

    def forward(signum, _frame) -> None:
        stopped.append(signal.Signals(signum).name)
        for p in procs:
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGTERM)

    before = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        yield procs, stopped
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for p in procs:  # an exception here (or a second signal): none outlives this process
            if p.poll() is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
