"""Run generated Python programs in a sandbox: each in its own short-lived child process, never here.

A metric that scores generated code by running it (``exec_output``, finetune/metrics.py) calls
``run_programs``. Each program runs as ``python -I -S -B`` (isolated: no user site, no environment
variables, no ``PYTHON*`` settings, no current directory on the path) in an empty temporary folder with
an empty environment and no stdin, under resource limits set before the program runs:

- CPU seconds (``RLIMIT_CPU``) and a hard wall-clock ``timeout_s``, after which the child is killed;
- address space (``RLIMIT_AS``, ``MEMORY_BYTES``): ``'x' * 10**10`` is a MemoryError, not a swapped machine;
- no new processes (``RLIMIT_NPROC`` 0, which root ignores; the audit hook below refuses them too);
- file size (``RLIMIT_FSIZE``) = the output cap: stdout goes to a file, so a program that prints without
  end stops at ``max_output`` bytes (Python ignores SIGXFSZ; the write fails) and is an ``output_limit``.

Inside, an audit hook installed before the program refuses what an answer never needs (starting
processes, sockets, writing files, signals to other processes); it cannot be removed from Python code.
This is defence in depth for a metric, not a security boundary for hostile code: there is no network
or filesystem namespace (which needs privileges this tool does not ask for), so run untrusted models'
code on a machine you would let them use.

One process per program: a bad program (an endless loop, a crash, a fork attempt) spoils only its own
run. They run ``workers`` at a time; a program costs one interpreter start (~15-30 ms of CPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Fault = Literal["timeout", "crash", "output_limit"]
TIMEOUT_S = 2.0
MAX_OUTPUT = 4096  # bytes of stdout kept; more is an output_limit
MAX_SOURCE = 4096  # characters: a longer program is not run (a crash)
MEMORY_BYTES = 512 * 2**20

# Runs in the child before the program: resource limits (set here, in the child's own fresh
# interpreter, rather than in a preexec_fn, which is unsafe when the parent runs threads), then an audit
# hook that refuses what a short answer never needs.
_PRELUDE = r"""
import resource, sys
_cpu, _memory, _output = (int(a) for a in sys.argv[2:5])
for _limit, _value in ((resource.RLIMIT_CPU, _cpu), (resource.RLIMIT_AS, _memory),
                       (resource.RLIMIT_FSIZE, _output), (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0)):
    try:
        resource.setrlimit(_limit, (_value, _value))
    except (ValueError, OSError):  # a limit this platform lacks, or above the hard limit
        pass
def _deny(event, args):
    if event in ("os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty", "os.spawn",
                 "subprocess.Popen", "socket.connect", "socket.bind", "socket.sendto", "os.kill",
                 "os.killpg", "os.remove", "os.unlink", "os.rmdir", "os.rename", "os.replace",
                 "shutil.rmtree", "os.chmod", "os.chown", "os.truncate", "ctypes.dlopen"):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and ((isinstance(args[1], str) and any(c in args[1] for c in "wax+"))
                            or (isinstance(args[2], int) and args[2] & 3)):  # O_WRONLY or O_RDWR (os.open)
        raise PermissionError("sandbox: writing files is not allowed")
sys.addaudithook(_deny)
_src = sys.argv[1]
del sys.argv[1:], _deny, _cpu, _memory, _output, _limit, _value, resource
exec(compile(_src, "<answer>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


@dataclass(frozen=True)
class Run:
    """What one program did: its stdout (at most ``MAX_OUTPUT`` bytes, decoded) and, when it did not
    finish cleanly, why (``fault``); ``detail`` is the last line of its stderr or the exit status."""

    stdout: str
    fault: Fault | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.fault is None


def run_program(source: str, timeout_s: float | None = None, max_output: int = MAX_OUTPUT) -> Run:
    """Run one program in the sandbox (see the module docstring); never raises for what the program does.
    ``timeout_s``: default ``TIMEOUT_S``, read at the call."""
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    if "\0" in source or len(source) > MAX_SOURCE:
        why = "a NUL byte" if "\0" in source else f"longer than {MAX_SOURCE} characters"
        return Run("", "crash", f"not run: {why}")
    with tempfile.TemporaryDirectory(prefix="recipetune-sandbox-") as name:
        folder = Path(name)
        with (folder / "stdout").open("wb") as out, (folder / "stderr").open("wb") as err:
            try:
                proc = subprocess.run(
                    [sys.executable, "-I", "-S", "-B", "-c", _PRELUDE, source,
                     str(int(timeout_s) + 1), str(MEMORY_BYTES), str(max_output)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=folder, env={}, timeout=timeout_s,
                    start_new_session=True)  # its own session: a kill reaches it and nothing of ours
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
        with (folder / "stdout").open("rb") as f:
            raw = f.read(max_output + 1)
        with (folder / "stderr").open("rb") as f:
            err_text = f.read(max_output).decode("utf-8", "replace")
    stdout = raw[:max_output].decode("utf-8", "replace")
    last = err_text.strip().splitlines()[-1] if err_text.strip() else ""
    if code is None:
        return Run(stdout, "timeout", f"killed after {timeout_s:g} s")
    if len(raw) >= max_output:
        return Run(stdout, "output_limit", f"printed {max_output} bytes or more")
    if code != 0:
        return Run(stdout, "crash", last or f"exit status {code}")
    return Run(stdout)


def run_programs(sources: Sequence[str], timeout_s: float | None = None, max_output: int = MAX_OUTPUT,
                 workers: int | None = None) -> list[Run]:
    """Run each program in its own sandboxed process, ``workers`` at a time (default: the CPUs), in order."""
    if not sources:
        return []
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, timeout_s, max_output), sources))
