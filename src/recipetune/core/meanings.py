"""What a knob is, for any trainer: the vocabulary of ``means:``.

A command workload's knob may say what it is (``batch_size: {default: 2, means: micro_batch}``). The
analyst's facts and playbook rules are written in the reference trainer's names (``micro_batch_size``,
``accum_steps``, ``dtype == 'fp32'``); a meaning maps an outside trainer's knob onto that name and
its values onto the reference's (``bfloat16`` is ``bf16``, a ``--compile`` flag set to true is
``default``). A knob without a meaning stays the trainer's own: rules that need it stay silent.
The table in docs/guard.md ("Knob meanings") is this vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from recipetune.core.recipe import KnobSet, Scalar


@dataclass(frozen=True)
class Meaning:
    word: str  # what a campaign writes in ``means:``
    fact: str  # the analyst's name for it (the reference trainer's knob or fact)
    help: str
    # Categorical meanings: canonical value -> what trainers write for it (compared case-blind).
    values: Mapping[str, tuple[Scalar, ...]] = field(default_factory=dict)


_OFF, _ON = (False, "false", "off", "no", "0", "none"), (True, "true", "on", "yes", "1")

VOCABULARY: dict[str, Meaning] = {m.word: m for m in [
    Meaning("micro_batch", "micro_batch_size", "sequences per forward/backward pass per process"),
    Meaning("grad_accum", "accum_steps", "micro-batches accumulated per optimizer step per process"),
    Meaning("global_batch", "global_batch_size", "sequences per optimizer step, all processes together"),
    Meaning("nproc", "nproc", "data-parallel processes (or devices) of one run"),
    Meaning("seq_len", "seq_len", "tokens per sequence"),
    Meaning("lr", "lr", "peak learning rate"),
    Meaning("seed", "seed", "the random seed of the run"),
    Meaning("dtype", "dtype", "compute precision", {
        "fp32": ("fp32", "float32", "32", "32-true", "no"), "bf16": ("bf16", "bfloat16", "bf16-mixed", "bf16-true"),
        "fp16": ("fp16", "float16", "half", "16-mixed")}),
    Meaning("compile", "compile", "torch.compile of the model", {
        "off": _OFF, "default": (*_ON, "default"), "max-autotune": ("max-autotune",)}),
    Meaning("activation_checkpointing", "activation_checkpointing", "recomputing activations in the backward pass", {
        "none": _OFF, "selective": ("selective", "op", "layer"), "full": (*_ON, "full")}),
    Meaning("optimizer_impl", "optimizer_impl", "how the optimizer update runs", {
        "for-loop": (False, "for-loop", "forloop", "false"), "foreach": ("foreach",),
        "fused": (True, "fused", "true")}),
    Meaning("attention", "attention", "attention kernel", {
        "sdpa": (True, "sdpa", "flash", "true"), "math": (False, "math", "eager", "manual", "false")}),
    Meaning("matmul_precision", "matmul_precision", "fp32 matmul precision (torch.set_float32_matmul_precision)", {
        "highest": ("highest",), "high": ("high", "tf32"), "medium": ("medium",)}),
    Meaning("num_threads", "num_threads", "intra-op CPU threads (0 = the library's default)"),
    Meaning("dataloader_workers", "dataloader_workers", "data-loading worker processes"),
    Meaning("pin_memory", "pin_memory", "page-locked host memory for batches (true/false)"),
    Meaning("ddp_bucket_cap_mb", "ddp_bucket_cap_mb", "DDP gradient bucket size in MB"),
    Meaning("gradient_as_bucket_view", "gradient_as_bucket_view", "DDP gradients as views of its buckets"),
]}


def check_word(word: str) -> Meaning:
    """The meaning of ``word``; ValueError listing the vocabulary otherwise."""
    if word not in VOCABULARY:
        raise ValueError(f"unknown meaning {word!r}; expected one of {', '.join(VOCABULARY)}")
    return VOCABULARY[word]


def _same(a: Scalar, b: Scalar) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return str(a).lower() == str(b).lower()


def canonical(word: str, value: Scalar) -> Scalar:
    """``value`` of a knob meaning ``word``, in the reference trainer's terms (unchanged if unknown)."""
    for canon, aliases in VOCABULARY[word].values.items():
        if any(_same(value, a) for a in aliases):
            return canon
    return value


def native(word: str, target: Scalar, values: Sequence[Scalar]) -> Scalar | None:
    """The first of ``values`` (a knob's listed values) that means ``target``; None if none does."""
    for v in values:
        c = canonical(word, v)
        if c == target and isinstance(c, bool) == isinstance(target, bool):
            return v
    return None


class Glossary:
    """The meanings of one workload's knobs: analyst fact name <-> the workload's knob."""

    def __init__(self, knobs: KnobSet):
        self.knob_of: dict[str, str] = {}  # fact name -> knob name
        self.word_of: dict[str, str] = {}  # knob name -> meaning word
        for knob in knobs.values():
            if not knob.means:
                continue
            fact = VOCABULARY[knob.means].fact
            if fact in knobs and fact != knob.name:
                continue  # another knob is already named like the fact: that one is it
            self.knob_of.setdefault(fact, knob.name)
            self.word_of[knob.name] = knob.means

    def knob(self, name: str) -> str:
        """The workload's knob for a playbook name (itself when the workload has no meaning for it)."""
        return self.knob_of.get(name, name)

    def facts(self, recipe: Mapping[str, Scalar]) -> dict[str, Scalar]:
        """Facts named like the reference trainer's knobs, from the knobs that declare a meaning."""
        return {VOCABULARY[w].fact: canonical(w, recipe[k]) for k, w in self.word_of.items() if k in recipe}

    def value(self, knob: str, target: Scalar, values: Sequence[Scalar]) -> Scalar | None:
        """The listed value of ``knob`` that means ``target`` (the playbook's value)."""
        word = self.word_of.get(knob)
        if word is None:
            return next((v for v in values if v == target and isinstance(v, bool) == isinstance(target, bool)), None)
        return native(word, target, values)
