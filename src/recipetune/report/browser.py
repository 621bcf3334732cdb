"""Headless Chromium: a screenshot of a report (for docs) and what its console said (for tests)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(page: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Open ``page`` with ``args`` in a throwaway profile (no first-run state, nothing shared)."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("no chromium binary on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="recipetune-chromium-", ignore_cleanup_errors=True) as profile:
        cmd = [binary, *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
        # Its own process group: on a timeout the renderer and GPU helpers go too, not just the parent.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise RuntimeError(f"chromium did not finish within {timeout_s:.0f}s") from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def console_messages(stderr: str) -> list[str]:
    """Every console message (errors, refused scripts, uncaught exceptions) is logged as CONSOLE."""
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 2200) -> list[str]:
    """Write a PNG of the page's top ``height`` pixels; returns the console messages."""
    png.parent.mkdir(parents=True, exist_ok=True)
    res = chromium(page, f"--screenshot={png.resolve()}", f"--window-size={width},{height}")
    if res.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium failed (exit {res.returncode}): {res.stderr[-1000:]}")
    return console_messages(res.stderr)
