"""The reference route's ``path: base``: a small model pretrained on the stdlib corpus by the reference trainer.

The default (``tiny``, 400 steps of 8 x 256 bytes: 0.8M bytes, chosen as the most a base learns in a
first experiment's wait: docs/finetune.md, "The time of a first experiment") may ship in
``finetune/base/`` (3 MB, the model, recipe and step, no optimizer state; a release artefact, not
tracked in git), so a first experiment trains at once; a clone builds it on first use, about 137 CPU
seconds on one thread. ``base.json`` says what it is, and the shipped file is used only when all of it
holds here: the file's full sha256, the preset, sequence
length and steps asked for, the build settings this version uses (``base_settings``: batch, learning
rate ...), and the fingerprint of this Python's stdlib corpus (the pretraining text: another Python's
stdlib is other text, so that base would be a model of other data). Where any of it differs, or for
another size, or with ``RECIPETUNE_BUILD_BASE=1``, the base is built here once, with its progress, and
cached under ``<cache>/base/`` (``RECIPETUNE_CACHE``, default ~/.cache/recipetune; the name carries a
digest of the settings, so a changed recipe is built anew); a cached build is used before the shipped
one. ``shipped_refusal`` says why a shipped base is not used, so the build it costs is never a surprise.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from recipetune.finetune.recipe import ModelSpec

SHIPPED = Path(__file__).parent / "base"  # the default base and its base.json
BUILD_ENV = "RECIPETUNE_BUILD_BASE"  # 1: build the base here even where a matching one ships
# The build's batch (sequences of pretrain_seq_len bytes) and peak learning rate, chosen by measurement
# (docs/finetune.md, "The time of a first experiment"): the most a base learns in a first experiment's wait.
BATCH = 8
LR = 3e-3


def base_settings(spec: ModelSpec) -> dict:
    """What the base build sets (the reference trainer's defaults do the rest): part of the base's
    identity, in its cache name and checked against a shipped base.json."""
    return {
        "model": spec.preset, "data": "stdlib", "seq_len": spec.pretrain_seq_len, "global_batch_size": BATCH,
        "micro_batch_size": BATCH, "lr": LR, "warmup_steps": min(50, spec.pretrain_steps // 10 + 1),
        "lr_decay_steps": spec.pretrain_steps, "seed": 0, "num_threads": 1,  # 1 thread: a shared CPU
    }


def base_recipe(spec: ModelSpec) -> dict:
    """The reference trainer's recipe for the base ``spec`` asks for (what a shipped checkpoint must hold)."""
    from recipetune.trainer.knobs import reference_knobs

    return dict(reference_knobs().resolve(base_settings(spec)))


def _cached(spec: ModelSpec, cache: Path | None = None) -> Path:
    """Where this machine's own build of the base lives: one per Python version (its stdlib is the corpus)
    and per build settings (a changed recipe never reuses an old build)."""
    from recipetune.core.measure import cache_dir

    v = sys.version_info
    digest = hashlib.sha256(json.dumps(base_settings(spec), sort_keys=True).encode()).hexdigest()[:8]
    name = f"ref-{spec.preset}-stdlib-py{v.major}.{v.minor}-s{spec.pretrain_seq_len}-n{spec.pretrain_steps}-{digest}"
    return (cache or cache_dir()) / "base" / f"{name}.pt"


@functools.cache
def _sha256(path: Path, size: int, mtime_ns: int) -> str:  # size and mtime: a changed file is hashed again
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def stdlib_fingerprint() -> str:
    """This Python's stdlib corpus as the base was pretrained on it (trainer/data.py; < 1 s, cached there)."""
    from recipetune.trainer.data import load_corpus

    return load_corpus("stdlib").fingerprint


def shipped_refusal(spec: ModelSpec, shipped: Path | None = None) -> str | None:
    """Why the base that ships is not the one ``spec`` asks for here; None when it is (then it is used)."""
    folder = shipped or SHIPPED
    try:
        meta = json.loads((folder / "base.json").read_text())
        path = folder / meta["file"]
        want = (meta["preset"], meta["pretrain_seq_len"], meta["pretrain_steps"])
        sha, corpus, settings = meta["sha256"], meta["corpus_fingerprint"], dict(meta["settings"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{folder / 'base.json'} is unreadable ({type(e).__name__}: {e})"
    asked = (spec.preset, spec.pretrain_seq_len, spec.pretrain_steps)
    if want != asked:
        return f"it is preset/seq_len/steps {want}, this experiment asks for {asked}"
    if settings != (now := base_settings(spec)):
        changed = sorted(k for k in settings.keys() | now.keys() if settings.get(k) != now.get(k))
        return (f"it was built with {', '.join(f'{k}={settings.get(k)}' for k in changed)}; "
                f"this version builds with {', '.join(f'{k}={now.get(k)}' for k in changed)}")
    if not path.is_file():
        return f"{path} is missing"
    st = path.stat()
    if (got := _sha256(path, st.st_size, st.st_mtime_ns)) != sha:
        return f"{path} has sha256 {got}, base.json says {sha}: the file is not the one that was built"
    if (here := stdlib_fingerprint()) != corpus:
        return (f"it was pretrained on a stdlib corpus with fingerprint {corpus} ({meta.get('corpus', '')}); "
                f"this Python's is {here}")
    return None


def base_to_build(spec: ModelSpec, cache: Path | None = None, shipped: Path | None = None) -> tuple[Path, str] | None:
    """Where the base ``spec`` asks for will be built and why, when it must be (neither cached nor a
    matching shipped one), else None."""
    path = _cached(spec, cache)
    if path.is_file():
        return None
    if os.environ.get(BUILD_ENV) == "1":
        return path, f"{BUILD_ENV}=1"
    why = shipped_refusal(spec, shipped)
    return None if why is None else (path, f"the shipped base is not used: {why}")


def base_checkpoint(spec: ModelSpec, cache: Path | None = None, log=print,
                    progress: Callable[[int, int], None] | None = None, shipped: Path | None = None) -> Path:
    """The stdlib-pretrained base model: this machine's cached build, else the matching one that ships,
    else built here once by the reference trainer (``progress(step, steps)`` while it trains) and cached."""
    from recipetune.trainer.loop import train

    path = _cached(spec, cache)
    build = base_to_build(spec, cache, shipped)
    if build is None:
        if path.is_file():
            return path
        folder = shipped or SHIPPED
        return folder / json.loads((folder / "base.json").read_text())["file"]
    folder, name = path.parent, path.stem
    folder.mkdir(parents=True, exist_ok=True)
    log(f"building the base model {name} ({spec.pretrain_steps} steps on the stdlib corpus; once): {build[1]}")
    t0 = time.perf_counter()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    run_dir = folder / f"{name}.run"
    done = threading.Event()
    if progress is not None:  # the trainer's own metrics stream says how far it got
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        threading.Thread(target=_follow, args=(run_dir / "metrics.jsonl", spec.pretrain_steps, progress, done),
                         daemon=True).start()
    try:
        train(base_recipe(spec), spec.pretrain_steps, run_dir, save_checkpoint=tmp)
    finally:
        done.set()
    os.replace(tmp, path)  # atomic: a concurrent experiment never loads half a checkpoint
    if progress is not None:
        progress(spec.pretrain_steps, spec.pretrain_steps)
    log(f"base model built in {time.perf_counter() - t0:.0f}s: {path}")
    return path


def _follow(metrics: Path, total: int, progress: Callable[[int, int], None], done: threading.Event) -> None:
    """``progress(step, total)`` from the last training line of a run's metrics.jsonl, twice a second."""
    seen = 0
    while not done.wait(0.5):
        try:
            lines = metrics.read_text().splitlines()
        except OSError:
            continue
        steps = [json.loads(x).get("step", 0) for x in lines[-3:] if '"loss"' in x and x.endswith("}")]
        if steps and steps[-1] != seen:  # a line still being written does not end with } and is skipped
            seen = steps[-1]
            progress(seen, total)
