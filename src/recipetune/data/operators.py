"""The data operators, one function each (configs in ``data/ops.py``, how they run in
``data/runtime.py``): ``apply(op, rows, ctx) -> Outcome``.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
from xxhash import xxh3_64_intdigest

from recipetune.core.expr import ExprError
from recipetune.core.expr import evaluate as eval_expr
from recipetune.data.decontam import FAMILY, RENAMED
from recipetune.data.frames import families
from recipetune.data.minhash import near_duplicates, signatures
from recipetune.data.ops import (
    Augment,
    Convert,
    Decontaminate,
    DedupExact,
    DedupNear,
    Export,
    FilterCharset,
    FilterLength,
    FilterRegex,
    FilterRepetition,
    Load,
    Mix,
    OpBase,
    Sample,
    Synthesize,
)
from recipetune.data.runtime import (
    KEPT,
    Context,
    OpError,
    Outcome,
    array_map,
    as_dataset,
    batch_map,
    columns_of,
    combine,
    concat,
    conform,
    removal,
    removal_by_reason,
    rows_of,
    texts_of,
)
from recipetune.data.text import normalize, template_fields, tokens


def apply(op: OpBase, rows, ctx: Context) -> Outcome:
    """Run one operator (dispatch on its config type) on a ``datasets.Dataset`` (or a list of rows)."""
    return _APPLY[type(op)](op, as_dataset(rows), ctx)


# --- the operators ----------------------------------------------------------------------------------

def _load(op: Load, ds, ctx: Context) -> Outcome:
    new = conform(as_dataset(ctx.read_file(op.path, "path")), ctx.features, "path", op.path)
    out = Outcome(new, added=len(new))
    out.removed["replaced by " + op.path] = len(ds)
    return out


def _is_string(feature) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _convert(op: Convert, ds, ctx: Context) -> Outcome:
    rename = {k: v for k, v in op.rename.items() if k in ds.column_names and k != v}
    if rename:
        ds = ds.rename_columns(rename)
    names = ds.column_names
    made = list(op.templates)
    final = list(op.keep) if op.keep is not None else list(dict.fromkeys([*names, *made]))
    strip = [c for c in final if c in made or (c in names and _is_string(ds.features[c]))] if op.strip else []
    missing = [c for c in final if c not in names and c not in made]
    reads = {f for t in op.templates.values() for f in template_fields(t)} | {c for c in strip if c in names}
    if not made and not strip and not missing and final == names:
        return Outcome(ds)

    def fn(batch: dict[str, list], n: int) -> dict[str, list]:
        out: dict[str, list] = {}
        if op.templates:
            rows = rows_of(batch, n)
            for name, template in op.templates.items():
                values = []
                for row in rows:
                    row[name] = template.format(**{k: "" if v is None else v for k, v in row.items()})
                    values.append(row[name])
                out[name] = values
        for c in strip:
            out[c] = [v.strip() if isinstance(v, str) else v for v in out.get(c, batch.get(c, []))]
        for c in missing:
            out[c] = [None] * n
        return out

    mapped = batch_map(ds, fn, [c for c in names if c in reads], ctx, "convert",
                       remove=[c for c in names if c not in final])
    return Outcome(mapped.select_columns(final))


def _dedup_exact(op: DedupExact, ds, ctx: Context) -> Outcome:

    if len(ds) == 0:
        return Outcome(ds)

    def key(batch: dict[str, list], n: int) -> list[str]:
        if op.fields is None:
            return [normalize(ctx.render(row)) for row in rows_of(batch, n)]
        cols = [batch.get(f, [None] * n) for f in op.fields]
        return [normalize("\x1f".join(str(v) for v in values)) for values in zip(*cols, strict=True)]

    def hashes(batch: dict[str, list], n: int) -> np.ndarray:
        return np.fromiter((xxh3_64_intdigest(k.encode()) for k in key(batch, n)), dtype=np.uint64, count=n)

    h = array_map(ds, hashes, op.fields or ctx.prompt_fields, ctx, "hash", np.uint64)[:, 0]
    _, first = np.unique(h, return_index=True)  # the first occurrence of every text is kept
    keep = np.zeros(len(h), dtype=bool)
    keep[first] = True
    dropped = np.flatnonzero(~keep)
    return removal(ds, keep, dropped, np.zeros(len(dropped), dtype=np.int64), ["exact duplicate"], ctx)


def _dedup_near(op: DedupNear, ds, ctx: Context) -> Outcome:

    if len(ds) == 0:
        return Outcome(ds)
    m = op.num_perm
    sig = array_map(ds, lambda batch, n: signatures(texts_of(batch, n, op.field, ctx), m), columns_of(op.field, ctx),
                    ctx, "minhash", np.uint32, m)
    match = near_duplicates(sig, op.threshold)
    dropped = np.flatnonzero(match >= 0)
    return removal(ds, match < 0, dropped, np.zeros(len(dropped), dtype=np.int64),
                    [f"near duplicate (MinHash >= {op.threshold})"], ctx)


def _filter_length(op: FilterLength, ds, ctx: Context) -> Outcome:
    def reasons(batch: dict[str, list], n: int) -> list[str | None]:
        out: list[str | None] = []
        for text in texts_of(batch, n, op.field, ctx):
            if len(text) < op.min_chars:
                out.append(f"shorter than {op.min_chars} chars")
            elif op.max_chars is not None and len(text) > op.max_chars:
                out.append(f"longer than {op.max_chars} chars")
            else:
                out.append(None)
        return out

    return removal_by_reason(ds, reasons, columns_of(op.field, ctx), ctx, "filter_length")


_CHARSETS = {
    "ascii": lambda c: ord(c) < 128,
    "latin": lambda c: ord(c) < 0x250,
    "cyrillic": lambda c: "\u0400" <= c <= "\u04ff" or not c.isalpha(),
}


def _filter_charset(op: FilterCharset, ds, ctx: Context) -> Outcome:
    inside = _CHARSETS[op.charset]
    why = f"under {op.min_ratio:.0%} {op.charset}"

    def reason(text: str) -> str | None:
        chars = [c for c in text if not c.isspace()]
        return why if chars and sum(map(inside, chars)) / len(chars) < op.min_ratio else None

    return removal_by_reason(ds, lambda batch, n: [reason(t) for t in texts_of(batch, n, op.field, ctx)],
                    columns_of(op.field, ctx), ctx, "filter_charset")


def repeated_fraction(text: str, n: int) -> float:
    toks = tokens(text)
    grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def _filter_repetition(op: FilterRepetition, ds, ctx: Context) -> Outcome:
    why = f"over {op.max_fraction:.0%} repeated {op.ngram}-grams"
    return removal_by_reason(ds, lambda batch, n: [why if repeated_fraction(t, op.ngram) > op.max_fraction else None
                                          for t in texts_of(batch, n, op.field, ctx)],
                    columns_of(op.field, ctx), ctx, "filter_repetition")


def _filter_regex(op: FilterRegex, ds, ctx: Context) -> Outcome:
    pattern = re.compile(op.pattern)
    why = f"{'no ' if op.keep == 'match' else ''}match for /{op.pattern}/"
    want = op.keep == "match"
    return removal_by_reason(ds, lambda batch, n: [None if (pattern.search(t) is not None) == want else why
                                          for t in texts_of(batch, n, op.field, ctx)],
                    columns_of(op.field, ctx), ctx, "filter_regex")


def _decontaminate(op: Decontaminate, ds, ctx: Context) -> Outcome:
    """Each batch judged alone in the workers; whether a renamed copy is one of a family of the training
    rows (``frames.families``) over all of them, in the parent, from the frames each row fills."""
    import datasets

    index = ctx.contamination_index(op)  # once, in the parent: forked workers share it
    parts = ctx.parts or (lambda row: [ctx.render(row)])

    def reason(hit: tuple[str, str] | None) -> str | None:
        if hit is None or hit[1] == RENAMED and op.renamed == "keep":
            return None  # (the index ranks a renamed copy last: a row that is also another copy is that)
        why = f"overlaps {hit[0]} ({hit[1]})"
        return KEPT + why if hit[1] == RENAMED and op.renamed == "report" else why

    def judge(batch: dict[str, list], n: int) -> dict[str, list]:
        judged = index.judge_batch([parts(row) for row in rows_of(batch, n)])
        return {"reason": [reason(j.hit) for j in judged], "fills": [list(j.fills) for j in judged],
                "renamed": [j.renamed for j in judged]}

    def revise(table):
        """The reasons, with each renamed copy one of a family counted and kept (unless renamed copies are
        kept unsaid): read only for the rows one token off an input, few."""
        import pyarrow as pa
        import pyarrow.compute as pc

        reasons = table.column("reason").combine_chunks()
        some = pa.array(np.flatnonzero(pc.list_value_length(table.column("fills")).to_numpy(zero_copy_only=False)))
        if not len(some):
            return reasons
        fills, renamed = (pc.take(table.column(c), some).to_pylist() for c in ("fills", "renamed"))
        why = pc.take(reasons, some).to_pylist()
        family = families(fills, renamed)
        new = {i: KEPT + w.removeprefix(KEPT).replace(RENAMED, FAMILY)
               for i, w, f in zip(some.to_pylist(), why, family, strict=True) if f and w is not None}
        if not new:
            return reasons
        mask = np.zeros(len(reasons), dtype=bool)
        mask[list(new)] = True
        return pc.replace_with_mask(reasons, pa.array(mask), pa.array([new[i] for i in sorted(new)], pa.string()))

    more = {"fills": datasets.Sequence(datasets.Value("string")), "renamed": datasets.Value("string")}
    return removal_by_reason(ds, judge, ctx.prompt_fields, ctx, "decontaminate", more, revise)


def _sample(op: Sample, ds, ctx: Context) -> Outcome:
    k = op.n if op.n is not None else round(op.fraction * len(ds))
    k = min(k, len(ds))
    if k == len(ds):
        return Outcome(ds)
    keep = sorted(random.Random(op.seed).sample(range(len(ds)), k))
    out = Outcome(ds.select(keep, new_fingerprint=f"{ctx.step}-sample"))
    out.removed["not sampled"] = len(ds) - k
    return out


def _mix(op: Mix, ds, ctx: Context) -> Outcome:
    rng = random.Random(op.seed)
    base_share = 1.0 - sum(s.ratio for s in op.sources)
    total = len(ds) / base_share  # the current rows are the base share of the result
    out = Outcome(ds)
    parts = [ds]
    for i, src in enumerate(op.sources):
        fld = f"sources.{i}.path"
        pool = as_dataset(ctx.read_file(src.path, fld))
        want = min(len(pool), round(src.ratio * total))
        picked = pool.select(rng.sample(range(len(pool)), want))
        for j, part in enumerate(parts):
            parts[j], picked = combine(part, picked, fld, src.path)
        parts.append(picked)
        out.added += want
    rows = concat(parts)
    order = list(range(len(rows)))
    rng.shuffle(order)
    out.rows = rows.select(order, new_fingerprint=f"{ctx.step}-mix")
    return out


_PUNCT = re.compile(r"[^\w\s]")


def augment_text(text: str, rule: str, rng: random.Random) -> str:
    if rule == "lowercase":
        return text.lower()
    if rule == "uppercase":
        return text.upper()
    if rule == "drop_punctuation":
        return _PUNCT.sub("", text)
    if rule == "strip_spaces":
        return " ".join(text.split())
    words = text.split(" ")  # extra_spaces: double one space at random
    if len(words) > 1:
        i = rng.randrange(len(words) - 1)
        words[i] += " "
    return " ".join(words)


def _augment(op: Augment, ds, ctx: Context) -> Outcome:
    import datasets

    rng = random.Random(op.seed)  # one sequence over the rows in order: this map runs in one process
    rewrite = [f for f in op.fields or ctx.prompt_fields if f in ds.column_names and _is_string(ds.features[f])]
    fields = list(dict.fromkeys(rewrite))
    if len(ds) == 0:
        return Outcome(ds)

    def fn(batch: dict[str, list], n: int) -> dict[str, list]:
        out: dict[str, list] = {f: list(batch[f]) for f in fields}
        copy = [False] * n
        for i in range(n):
            if rng.random() >= op.fraction:
                continue
            rule = rng.choice(op.rules)
            for f in rewrite:
                v = out[f][i]
                if isinstance(v, str):
                    out[f][i] = augment_text(v, rule, rng)
                    copy[i] = copy[i] or out[f][i] != v
        return {**out, "_copy": copy}

    features = datasets.Features({**{f: ds.features[f] for f in fields}, "_copy": datasets.Value("bool")})
    rewritten = batch_map(ds, fn, fields, ctx, "augment", features=features, parallel=False)
    picked = np.flatnonzero(rewritten.data.column("_copy").to_numpy(zero_copy_only=False))
    if not len(picked):
        return Outcome(ds)
    whole = datasets.concatenate_datasets([ds.remove_columns(fields), rewritten.remove_columns("_copy")], axis=1)
    copies = whole.select(picked).select_columns(ds.column_names)
    return Outcome(concat([ds, copies]), added=len(picked))


def _synthesize(op: Synthesize, ds, ctx: Context) -> Outcome:
    import datasets

    rng = random.Random(op.seed)
    columns: dict[str, list[str]] = {name: [] for name in op.fields}
    for _ in range(op.n):
        values = {name: (rng.randint(*s.range) if s.range else rng.choice(s.choices)) for name, s in op.slots.items()}
        for name, template in op.fields.items():
            text = template.format(**values)
            if text.startswith("="):
                try:
                    result = eval_expr(text[1:], {})
                except ExprError as e:
                    raise OpError(f"fields.{name}", f"fields.{name}: {e}") from None
                text = str(int(result)) if isinstance(result, float) and result.is_integer() else str(result)
            columns[name].append(text)
    new = datasets.Dataset.from_dict(columns)
    if len(ds) == 0 and not ds.column_names:
        return Outcome(new, added=op.n)
    base, new = combine(ds, new, "fields", "synthesized rows")
    return Outcome(concat([base, new]), added=op.n)


def _export(op: Export, ds, ctx: Context) -> Outcome:
    path = Path(op.path).expanduser()
    if not path.is_absolute():
        path = (ctx.out_dir or ctx.base_dir) / path
    ctx.exports.append((path, ds))  # written by the chain at its end: nothing on bad input
    return Outcome(ds)


def write_rows(path: Path, rows) -> None:
    """Write a ``datasets.Dataset`` (or a list of rows) as JSONL, CSV or Parquet, by the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = as_dataset(rows)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        ds.to_json(str(path), lines=True, force_ascii=False)
    elif suffix == ".csv":
        ds.to_csv(str(path), index=False)
    else:
        ds.to_parquet(str(path))


_APPLY = {
    Load: _load, Convert: _convert, DedupExact: _dedup_exact, DedupNear: _dedup_near,
    FilterLength: _filter_length, FilterCharset: _filter_charset, FilterRepetition: _filter_repetition,
    FilterRegex: _filter_regex, Decontaminate: _decontaminate, Sample: _sample, Mix: _mix,
    Augment: _augment, Synthesize: _synthesize, Export: _export,
}
