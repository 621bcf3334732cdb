"""What a command workload's runs depend on, as a manifest: one entry per thing, ``name -> digest``.

A stored run is reused only for the same experiment (guard/runs.py), so the manifest covers what a
run's results can depend on besides its recipe and step count:

- ``code:PATH``: every Python file under the trainer's folder, by content (a trainer runs its files
  by import, by path, through ``exec`` or a launcher: reading its imports would miss some), skipping
  virtual environments, caches, version control and the folders recipetune writes; or the files
  ``workload.code`` globs name (``!glob`` leaves some out); plus every file its argv names;
- ``data:PATH``: its data files (the files under ``data/``, ``datasets/`` and the argv-named files
  that are not code) by size and modification time, never by content, so that a 100 GB corpus costs
  one ``stat``; or ``workload.data_fingerprint``, declared (a dataset's version);
- ``package:NAME``: the version of every distribution installed in the TRAINER's interpreter (the one
  its command runs, asked once per process: nothing is imported into recipetune's), and ``python``;
- ``env:NAME``: the variables ``workload.fingerprint_env`` names, as recipetune's environment has them;
- ``spec``: how the trainer is launched and read back (the workload section), ``recipetune``: the
  version that reads its metrics.

The manifest is stored with the runs, so that a verdict after a change can say what changed
(``changes``). Its cost is one read per Python file and one ``stat`` per data file
(docs/benchmarks.md, "Fingerprint").
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from recipetune.core.filenames import PROFILE, RESULT, RUNS_FOLDER, STORE_FILE, STUDY_DB

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox", ".nox",
             ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "site-packages",
             "wandb", "mlruns", "runs", RUNS_FOLDER}
DATA_DIRS = {"data", "datasets", "dataset"}
# Files that mark a folder recipetune wrote (a run, a campaign, a runs store): no trainer code there.
WRITTEN_MARKS = (RESULT, STUDY_DB, STORE_FILE, PROFILE)
SMALL = 1 << 20  # an argv-named file under 1 MiB is hashed; a larger one is data, by size and time

QUERY = """
import json, sys
from importlib import metadata
found = {}
for d in metadata.distributions():  # in sys.path order: the first of a name is the one imported
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    if name and name not in found:
        found[name] = d.version
print(json.dumps({"python": sys.version.split()[0], "packages": found}))
"""
_ASKED: dict[tuple, dict[str, str]] = {}  # interpreter (path, mtime, PYTHONPATH) -> its manifest part


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def stat_digest(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} bytes, mtime {st.st_mtime_ns}"


def _skipped(folder: Path, name: str) -> bool:
    return (name in SKIP_DIRS or name.startswith(".") or (folder / name / "pyvenv.cfg").exists()
            or any((folder / name / mark).exists() for mark in WRITTEN_MARKS))


def walk(root: Path, data: bool) -> list[Path]:
    """Python files under ``root`` (``data=False``), or the files of its data folders (True), pruned."""
    found = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not _skipped(here, d))
        in_data = any(part in DATA_DIRS for part in here.relative_to(root).parts)
        if data and in_data:  # the data: what data folders hold besides code
            found += [here / name for name in sorted(files) if not name.endswith(".py")]
        elif not data:
            found += [here / name for name in sorted(files) if name.endswith(".py")]
    return found


def globbed(root: Path, patterns: list[str]) -> list[Path]:
    """The files ``patterns`` name under ``root`` (``**`` for any depth; ``!pattern`` removes)."""
    keep: set[Path] = set()
    for pattern in (p for p in patterns if not p.startswith("!")):
        keep |= {Path(p) for p in glob.glob(str(root / pattern), recursive=True) if os.path.isfile(p)}
    drop = [p[1:] for p in patterns if p.startswith("!")]
    return sorted(p for p in keep if not any(fnmatch.fnmatch(_name(p, root), d) for d in drop))


def _name(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def trainer_python(argv0: str, env: dict[str, str], cwd: Path) -> tuple[str, str]:
    """The interpreter the command runs (path, how it was found): the argv's own Python, or the one a
    launcher's shebang names (torchrun, accelerate, deepspeed); else ``python3`` on the PATH."""
    exe = sys.executable if argv0 == "{python}" else argv0
    path = env.get("PATH", os.environ.get("PATH", ""))
    found = str(cwd / exe) if os.sep in exe and not os.path.isabs(exe) else shutil.which(exe, path=path)
    if found and re.fullmatch(r"python[\d.]*", Path(found).name):
        return found, "the command's interpreter"
    if found and os.path.isfile(found):
        try:
            with open(found, "rb") as f:
                first = f.readline(300).decode(errors="replace")
        except OSError:
            first = ""
        words = first[2:].split() if first.startswith("#!") else []
        if words and Path(words[0]).name == "env" and len(words) > 1:
            words = [shutil.which(words[1], path=path) or words[1]]
        if words and "python" in Path(words[0]).name:
            return words[0], f"the interpreter {Path(found).name}'s first line names"
    fallback = shutil.which("python3", path=path) or sys.executable
    return fallback, f"{argv0!r} is not a Python interpreter: python3 on the PATH"


def packages(python: str, env: dict[str, str], cwd: Path) -> dict[str, str]:
    """``python`` and ``package:NAME`` entries of the interpreter, asked once per process."""
    try:
        mtime = os.stat(python).st_mtime_ns
    except OSError:
        return {"python": f"unknown: {python} not found"}
    key = (python, mtime, env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")), str(cwd))
    if key not in _ASKED:
        try:
            out = subprocess.run([python, "-c", QUERY], cwd=cwd, env={**os.environ, **env}, capture_output=True,
                                 text=True, timeout=120, check=True).stdout
            info = json.loads(out.strip().splitlines()[-1])
            _ASKED[key] = {"python": info["python"],
                           **{f"package:{k}": str(v) for k, v in sorted(info["packages"].items())}}
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError) as e:
            _ASKED[key] = {"python": f"unknown: {python} could not list its packages ({type(e).__name__})"}
    return dict(_ASKED[key])


def digest(manifest: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def changes(before: dict[str, str], now: dict[str, str], most: int = 6) -> list[str]:
    """What differs between two manifests, in words: ``model.py changed``, ``transformers 4.46.0 ->
    4.47.0`` ... (at most ``most``, then how many more)."""
    said = []
    for name in sorted(before.keys() | now.keys()):
        old, new = before.get(name), now.get(name)
        if old == new:
            continue
        kind, _, what = name.partition(":")
        if kind == "package":
            said.append(f"{what} {old or 'not installed'} -> {new or 'not installed'}")
        elif kind == "env":
            said.append(f"${what} {old!r} -> {new!r}")
        elif kind in ("code", "data"):
            said.append(f"{what} is new" if old is None else f"{what} is gone" if new is None else f"{what} changed")
        elif name == "spec":
            said.append("the workload section of the campaign file changed")
        else:
            said.append(f"{name} {old or '(none)'} -> {new or '(none)'}")
    return said[:most] + ([f"and {len(said) - most} more"] if len(said) > most else [])


def named_paths(cwd: Path, argv: list[str]) -> list[Path]:
    """The files and folders the argv names, whole or after '=' (train.py, --config=cfg.yaml,
    --data_dir=/corpus), as they are now; placeholders and the trainer's own folder left out."""
    found: list[Path] = []
    for arg in argv:
        for text in (arg, arg.partition("=")[2]):
            if not text or "{" in text:
                continue
            path = (cwd / text).resolve()
            if path.exists() and path not in found and not (path.is_dir() and path in (cwd, *cwd.parents)):
                found.append(path)
    return found


def command_manifest(cwd: Path, argv: list[str], env: dict[str, str], spec_json: str, code: list[str] | None,
                     data_fingerprint: str | None, env_names: list[str]) -> dict[str, str]:
    """The manifest of a command workload (the module's docstring says what each entry is)."""
    from recipetune import __version__

    manifest = {"spec": hashlib.sha256(spec_json.encode()).hexdigest()[:16], "cwd": str(cwd)}
    named = named_paths(cwd, argv)
    files = [p for p in named if p.is_file()]
    small = [p for p in files if p.suffix == ".py" or p.stat().st_size < SMALL]
    for f in (globbed(cwd, code) if code is not None else walk(cwd, data=False)) + small:
        manifest[f"code:{_name(f, cwd)}"] = file_digest(f)
    if data_fingerprint is not None:
        manifest["data"] = data_fingerprint
    else:
        big = [p for p in files if p not in small]
        folders = [f for d in named if d.is_dir() for f in sorted(d.rglob("*")) if f.is_file()]
        for f in walk(cwd, data=True) + big + folders:
            manifest[f"data:{_name(f, cwd)}"] = stat_digest(f)
    python, _ = trainer_python(argv[0], env, cwd)
    manifest["interpreter"] = python
    manifest.update(packages(python, env, cwd))
    for name in env_names:
        manifest[f"env:{name}"] = os.environ.get(name, "(unset)")
    manifest["recipetune"] = __version__
    return manifest


class FingerprintFields(BaseModel):
    """The fields of a command workload that declare what its stored runs depend on."""

    code: list[str] | None = Field(None, description="globs under cwd of the code hashed ('!glob' leaves out)")
    data_fingerprint: str | None = Field(None, description="the data's version, instead of its files' size and time")
    fingerprint_env: list[str] = Field(default_factory=list, description="environment variables a run depends on")

    @field_validator("fingerprint_env")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an environment variable name (letters, digits, _)")
        return names

    @field_validator("code")
    @classmethod
    def _globs(cls, globs: list[str] | None) -> list[str] | None:
        if globs is not None and not [g for g in globs if g.strip() and not g.startswith("!")]:
            raise ValueError("give at least one glob of files to hash, e.g. ['**/*.py']")
        return globs
