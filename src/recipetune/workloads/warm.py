"""Warm starts: a fresh process per run without paying for `import torch` every time.

A reference-trainer run spends seconds importing torch (and ``torch._dynamo``, which the first
optimizer step imports) before its first step. The warm launcher is one long-lived process that
imports all that once, runs nothing, and forks a fresh child per run: the child is a new process in
its own session (killed with its group on a timeout, as a cold run is), with its own log files,
working directory and environment, and it runs the trainer's ``main`` exactly as ``python -m
recipetune.trainer`` would. The launcher never runs a tensor operation, so no thread pool or device
context exists to be inherited by a fork.

On by default for single-process runs of the reference trainer (``nproc > 1`` goes through torchrun
as before); ``RECIPETUNE_WARM_START=0`` turns it off (every run then starts a new interpreter).
Protocol on the launcher's stdin/stdout: one JSON request per line, answered by ``{"pid": N}`` when
the child starts and ``{"pid": N, "returncode": R}`` when it ends. The launcher exits when the
driver closes its stdin, and kills a running child first if the driver died mid-run.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from recipetune.core.clock import LineClock
from recipetune.core.process import ProcessOutcome, Watch, opening

ENV_FLAG = "RECIPETUNE_WARM_START"


def enabled() -> bool:
    return os.environ.get(ENV_FLAG, "1") not in ("", "0", "false", "no")


# -- the launcher process ------------------------------------------------------------------------


def _child(req: dict) -> None:
    """In the forked child: become a fresh run, then exit with the trainer's code."""
    code = 1
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["python -m recipetune.trainer", *req["args"]]
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from recipetune.trainer.__main__ import main

        code = main(req["args"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _preload(req: dict) -> None:
    """Load the run's corpus here, once: this fork and every later one inherit it instead of reading,
    tokenizing and hashing it again. Only numpy work: still no tensor operation in the launcher."""
    from recipetune.trainer.data import preload
    from recipetune.trainer.knobs import reference_knobs

    args = req["args"]
    with contextlib.suppress(Exception):  # a bad recipe or corpus: the run itself says what is wrong
        os.chdir(req["cwd"])  # a relative corpus path means what it means to the run
        recipe = reference_knobs().resolve(json.loads(Path(args[args.index("--recipe") + 1]).read_text()))
        preload(str(recipe["data"]))


def serve() -> None:
    """The launcher: import once, then fork one child per request, one at a time."""
    import torch  # noqa: F401  (the point: paid once)
    import torch._dynamo  # noqa: F401  (imported by the first optimizer step otherwise)

    import recipetune.trainer.__main__  # noqa: F401

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it closes our stdin
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = os.read(0, 65536)
            if not chunk:
                return  # the driver is gone
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        req = json.loads(line)
        _preload(req)
        pid = os.fork()
        if pid == 0:
            _child(req)
        print(json.dumps({"pid": pid}), flush=True)
        # Wake the moment the child ends (a pidfd where Linux has one), not at the next poll.
        pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        watch = [0] if pidfd is None else [0, pidfd]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            # The driver sends nothing while a run lasts: stdin readable means it died (kill -9).
            # A trainer must not outlive it and steal the hardware from the next measurement.
            if 0 in select.select(watch, [], [], 0.2)[0] and not os.read(0, 65536):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
        if pidfd is not None:
            os.close(pidfd)
        print(json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}), flush=True)


# -- the driver side -----------------------------------------------------------------------------


class Launcher:
    """The driver's launcher processes: one per run in flight (loss-only runs may share the machine,
    process.sharing), each started on first use and reused after."""

    _lock = threading.Lock()
    _idle: list[subprocess.Popen] = []
    _all: list[subprocess.Popen] = []

    @classmethod
    def _new(cls) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "recipetune.workloads.warm"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True,
        )
        cls._all.append(proc)
        return proc

    @classmethod
    def start(cls) -> None:
        """Start a launcher now (it imports in the background); the first run then finds it ready."""
        with cls._lock:
            if not any(p.poll() is None for p in cls._idle):
                cls._idle.append(cls._new())

    @classmethod
    @contextlib.contextmanager
    def held(cls) -> Iterator[subprocess.Popen]:
        """A launcher for one run: an idle one, or a new one when every launcher is busy."""
        with cls._lock:
            cls._idle = [p for p in cls._idle if p.poll() is None]
            cls._all = [p for p in cls._all if p.poll() is None]
            proc = cls._idle.pop(0) if cls._idle else cls._new()
        try:
            yield proc
        finally:
            with cls._lock:
                if proc.poll() is None:
                    cls._idle.append(proc)

    @classmethod
    def processes(cls) -> list[subprocess.Popen]:
        """The launchers alive now."""
        with cls._lock:
            return [p for p in cls._all if p.poll() is None]

    @classmethod
    def close(cls) -> None:
        with cls._lock:
            procs, cls._idle, cls._all = cls._all, [], []
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # type: ignore[union-attr]
                proc.wait(timeout=10)


def _read(proc: subprocess.Popen, deadline: float | None) -> dict | None:
    """The launcher's next answer, or None if ``deadline`` passed first."""
    assert proc.stdout is not None
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.perf_counter())
        ready, _, _ = select.select([proc.stdout], [], [], wait)
        if not ready:
            return None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the warm launcher exited")
        return json.loads(line)


def run_warm(
    args: Sequence[str],
    *,
    log_dir: Path,
    timeout_s: float | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_interval_s: float = 0.25,
    stop_file: Path | None = None,
    timed: Sequence[Path] = (),
) -> ProcessOutcome:
    """``python -m recipetune.trainer ARGS`` as a fork of the warm launcher; like ``run_process``."""
    with opening(log_dir, env) as full_env, Launcher.held() as proc:
        req = {"args": list(args), "stdout": str(log_dir / "stdout.log"), "stderr": str(log_dir / "stderr.log"),
               "cwd": str(cwd or Path.cwd()), "env": full_env}
        watch = Watch(timeout_s, on_poll, stop_file)
        clock = LineClock(timed, watch.start).__enter__()
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        pid = _read(proc, None)["pid"]  # type: ignore[index]
        answer = None
        try:
            while answer is None:
                answer = _read(proc, time.perf_counter() + poll_interval_s)
                if answer is None and watch.must_stop():
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    answer = _read(proc, None)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # Ctrl-C in the driver must not leave a trainer running
            # The launcher answers for the killed child; a launcher that holds that answer unread
            # would give it to its next run, so it is read here or the launcher is not reused.
            try:
                if _read(proc, time.perf_counter() + 5) is None:
                    proc.kill()
            except Exception:
                proc.kill()
            raise
        finally:
            clock.__exit__()
        wall = time.perf_counter() - watch.start
    return watch.outcome(answer["returncode"], wall, log_dir, clock)


if __name__ == "__main__":
    serve()
