"""Decontamination's rule: the contamination index of the evaluation inputs, and what counts as a
copy of one (tokens and boilerplate are ``data/text.py``'s).

**What counts as evidence of a copy.** Decontamination compares what varies between rows, not what
every row shares. It reads a row's ``input_parts`` (the values the prompt template reads, never the
template's fixed text), and it masks *boilerplate*: every token covered by a word ``COMMON_N``-gram
that at least ``common_share`` of the evaluation rows contain (an instruction every prompt repeats,
a fixed preamble inside a field). What is left of an evaluation row is its *varying text* v. A
training row (its varying text u, masked alike) overlaps an evaluation row when:

- v has ``ngram`` tokens or more and u holds at least ``min_overlap`` of v's distinct word n-grams
  (a copy, renamed or re-prefixed, keeps most of them; an idiom two functions share, a few); a v of
  under 2 x ``ngram`` tokens not where u is v with one token changed, which the renamed rule below
  judges alone (a shared parameter list is most of a short signature's n-grams: issue 50);
- u contains v as a run of tokens (v of ``min_tokens`` or more, with two names or numbers or one rare
  one: a prompt copied, whatever was put around it; ``y ) :``, all that varies of ``def __init__(self,
  y):``, says no more than ``y``; where a short v's input has other values than u at its own shared
  places, ``anchors.values_differ``, u is that input with those values changed, which the renamed rule
  judges: ``v=7`` and ``tab=billing`` are shared text for being common, and a link with an input's
  user name but ``tab=orders&v=5`` is another link; where u holds a short v but not its input's fields
  whole, u is that input with its shared text changed: one token, the renamed rule judges; more, a
  copy only where a legitimate input would hold what u kept of those fields by chance at most
  ``RENAME_CHANCE`` times, among ``RARE_MIN_INPUTS`` inputs or more (``Evidence.improbable``; among
  fewer, v suffices): ``with open(os_helper.TESTFN, 'wb') as file:`` holds all that varies of ``with
  self.open(os_helper.TESTFN, encoding="utf-8") as f:``, and many inputs hold
  ``open(os_helper.TESTFN,``), or v with **one token changed** (a *renamed copy*): one name or one
  number replaced, at one place or everywhere, by another of its type (a name by a name, a number by a
  number: never an operator), v's fields lie whole in u, shared text included, with that one change
  (``Evidence.renamed``, data/evidence.py), and the names and numbers left alike say which input it
  is. Among ``RARE_MIN_INPUTS`` evaluation inputs or more, the chance decides (issue 50):
  ``RENAME_SHORT_WORDS`` or more left in a frame (the input with the changed places open) that a
  legitimate input would match by chance at most ``RENAME_CHANCE`` times (``data/frames.py``: ``(54 -
  51) * _ + 2``; words that come together, ``tkinter . ttk``, counted once). Among fewer, how common a
  word is cannot be told and the words are counted: ``RENAME_MIN_WORDS`` distinct ones in those fields
  of which ``RENAME_SHORT_WORDS`` vary and are no word of the task's structure, or
  ``RENAME_SHORT_WORDS`` such with one rare. A changed word of the task's structure (one in
  ``STRUCTURE_SHARE`` of the evaluation inputs, ``select``, ``buys``, a weekday) may ask another
  question: a copy only where ``RENAME_MIN_WORDS`` of the input's own values are left alike and the
  chance holds, never among few inputs. Never a copy where another evaluation input fills the same
  frame (a *sibling*: ``http_error_301`` beside ``http_error_302`` with the same parameters, the slot
  is what tells the inputs apart), nor where another training row fills it with another value (a
  *family* of the training rows, ``frames.families``, judged over all of them: kept and counted as
  ``FAMILY``). ``347+588=`` keeps one number of ``347+589=``: another sum; ``block number 17`` keeps
  no varying value of ``block number 7``: another input of its template; ``SELECT price FROM orders
  WHERE total > 310`` keeps four of ``... > 311``: a copy. Every input is found through its two rarest
  token pairs with no token in common (anchors), so one changed token leaves one of them (an input of
  2-3 varying tokens, also its rarest name or number alone; n-grams alone would miss it: one changed
  token costs an input of v tokens up to ``ngram`` of its v - ``ngram`` + 1 n-grams); an input of
  several fields (a chat turn and the next) is found field by field, so text added around one of them
  does not hide it. ``renamed`` (``remove`` | ``keep`` | ``report``) says whether renamed copies
  count: natural inputs that differ by one name (another function with the same parameters) are
  reported apart as ``renamed copy``;
- v is shorter than ``min_tokens`` (an input that is almost all shared text) and u's fields hold v
  and nothing else that varies, or u contains the whole evaluation input, shared text included;
- or their estimated Jaccard similarity reaches ``near_threshold`` (one-permutation MinHash over
  character 5-grams, ``data/minhash.py``), both of ``NEAR_MIN_CHARS`` or more.

**Where the copy carries the question.** A short v found inside u counts only where it is at least
``contain_share`` (half) of what each field it lies in says, the field's shared text (boilerplate)
outside it not counted and the input's own shared text around it counted with it: ``x[1:]`` in
``print(x[1:])`` is a copy, a literal ``"u"`` in ``self.write("u")`` or ``select`` in
``select.POLLOUT`` asks another question. The same holds for the n-grams a short v shares with u.
Inputs of 2 x ``ngram`` tokens or more carry their question wherever they are.

The index lives in memory, is never written, and answers which split a text overlaps and how, never
the evaluation text itself.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from recipetune.data import minhash
from recipetune.data.anchors import Input, aligned, anchors_of, pieces_of, values_differ, widened
from recipetune.data.carries import carries, covers
from recipetune.data.evidence import Evidence
from recipetune.data.frames import CONTENT as _CONTENT
from recipetune.data.frames import families
from recipetune.data.text import Boilerplate, part_tokens, tokens

RENAMED = "renamed copy"  # the reason a one-token copy is given: counted apart, kept where the task says
FAMILY = "renamed copy, but other training rows fill its frame"  # no copy (frames.families): kept, counted
Hit = tuple[str, str]  # (split, how): the split a training row overlaps and how (``hits_batch``)


class Judged(NamedTuple):
    """One training row as the index judged it alone (``ContaminationIndex.judge_batch``): its overlap,
    the frames it fills (``fill``: where it is an evaluation input with one token changed, a copy or not),
    and which of them its renamed copy is, if that is its overlap. ``frames.families`` weighs the fills
    of all the rows together."""

    hit: Hit | None
    fills: tuple[str, ...] = ()
    renamed: str | None = None


class _Seen(NamedTuple):
    """What a row's anchors found of evaluation input ``input``: a copy (``how``), or the row is that
    input with one token changed (``how`` None where that is no copy) and fills its frame (``fill``)."""

    split: str
    how: str | None
    input: int
    fill: str | None = None


NEAR_MIN_CHARS = 32  # MinHash over fewer character 5-grams than ~28 estimates similarity too roughly
# (two 8-character sums share half their shingles by chance): shorter texts have the token rules


class ContaminationIndex:
    """Evaluation rows (their input parts, by split) indexed as the module docstring says.
    ``settings`` has ``ngram``, ``min_overlap``, ``min_tokens``, ``common_share``, ``near_threshold``,
    ``num_perm``. It lives in memory and is never written anywhere."""

    def __init__(self, evals: dict[str, list[list[str]]], settings: Any):
        self.n, self.min_overlap, self.min_tokens = settings.ngram, settings.min_overlap, settings.min_tokens
        self.num_perm, self.share = settings.num_perm, settings.contain_share
        self.renamed = getattr(settings, "renamed", "remove")
        labelled = [(split, part_tokens(parts)) for split, rows in evals.items() for parts in rows]
        self.boilerplate = Boilerplate([toks for _, toks in labelled], settings.common_share)
        self.grams: dict[tuple[str, ...], list[int]] = {}  # varying n-gram -> the long inputs holding it
        self.long: list[tuple[str, int, int]] = []  # input of n tokens or more -> (split, its distinct n-grams,
        # its varying tokens)
        self.inputs: list[Input] = []
        # a token pair (or, for a one-token input, the token) -> (input, the pair's offset there)
        self.anchors: dict[Any, list[tuple[int, int]]] = {}
        self._parts: dict[str, tuple[list[str], list[str], Sequence[int]]] = {}
        varied = [(split, *self._split(parts)) for split, rows in evals.items() for parts in rows]
        df = Counter(p for _, _, v, _, _ in varied for p in set(zip(v, v[1:], strict=False)))
        df.update(t for _, _, v, _, _ in varied for t in set(v))  # (single tokens: anchors of 2-3 token inputs)
        near_texts, near_split = [], []
        self.evidence = Evidence([toks for _, toks, _, _, _ in varied])  # what weighs what is found
        for split, toks, v, pos, starts in varied:
            if not v:
                continue  # nothing varies: nothing to find a copy of
            if len(v) >= self.n:
                grams = {tuple(v[i : i + self.n]) for i in range(len(v) - self.n + 1)}
                for g in grams:
                    self.grams.setdefault(g, []).append(len(self.long))
                self.long.append((split, len(grams), len(v), len(self.inputs)))
            pieces = pieces_of(pos, starts)  # every input, however long: one changed token costs an n-gram rule
            # (up to n of its n-grams, the alignment nothing)
            for key, offset in anchors_of(v, df, pieces, self.evidence.says):
                self.anchors.setdefault(key, []).append((len(self.inputs), offset))
            ids = tuple(bisect_right(starts, pos[lo]) - 1 for lo, _ in pieces)
            parts = tuple((starts[k], starts[k + 1]) for k in ids)
            says = len({t for t in v if _CONTENT.fullmatch(t)})
            self.inputs.append(Input(split, tuple(v), tuple(toks), pos[0], pieces, tuple(pos), parts, ids, says))
            self.evidence.learn(self.inputs[-1])
            if len(text := " ".join(v)) >= NEAR_MIN_CHARS:
                near_texts.append(text)
                near_split.append(split)
        self.gram_starts = {g[:2] for g in self.grams}  # the token pairs an n-gram can start with
        self.single = any(isinstance(key, str) for key in self.anchors)
        self.near: dict[str, minhash.BucketIndex] = {}  # split -> its inputs' LSH buckets, test first
        if settings.near_threshold < 1 and near_texts:
            sig = minhash.signatures(near_texts, self.num_perm)
            for split in sorted(set(near_split), key=lambda s: s != "test"):
                rows = [i for i, s in enumerate(near_split) if s == split]
                self.near[split] = minhash.BucketIndex(sig[rows], settings.near_threshold)

    def hits(self, parts: Sequence[str]) -> Hit | None:
        return self.hits_batch([parts])[0]

    def hits_batch(self, rows: Sequence[Sequence[str]]) -> list[Hit | None]:
        """For each training row's input parts: (split, how) of an overlap, else None. ``how`` is
        ``<n>-grams``, ``same input``, ``contains a whole input``, ``renamed copy`` or
        ``near-duplicate``. The rows are the training rows, all of them: a renamed copy one of a family
        of them is none (``frames.families``); a data step judges its rows batch by batch
        (``judge_batch``) and the families over the whole."""
        judged = self.judge_batch(rows)
        family = families([j.fills for j in judged], [j.renamed for j in judged])
        return [None if f else j.hit for j, f in zip(judged, family, strict=True)]

    def judge_batch(self, rows: Sequence[Sequence[str]]) -> list[Judged]:
        """Each training row's input parts judged alone (``Judged``)."""
        split = [self._split(parts) for parts in rows]
        varying = [(v, pos) for _, v, pos, _ in split]
        judged = [self._token_hit(*row) for row in split]
        out = [j.hit for j in judged]
        if self.near:  # rows with no overlap yet, or one with validation only: test may still be near
            texts = {i: " ".join(varying[i][0]) for i, hit in enumerate(out)
                     if hit is None or hit[0] != "test" or self._weak(hit)}
            todo = [i for i, text in texts.items() if len(text) >= NEAR_MIN_CHARS]
            sig = minhash.signatures([texts[i] for i in todo], self.num_perm) if todo else None
            for split, index in self.near.items():
                if not todo:
                    break
                match = index.query(sig)
                for i in [i for i, j in zip(todo, match.tolist(), strict=True) if j >= 0]:
                    if out[i] is None or split == "test" or self._weak(out[i]):
                        out[i] = (split, "near-duplicate")
                # test rows found: done with them
                keep = [k for k, i in enumerate(todo) if out[i] is None or self._weak(out[i])]
                todo, sig = [todo[k] for k in keep], sig[keep]
        return [j if j.hit == hit else Judged(hit, j.fills) for j, hit in zip(judged, out, strict=True)]

    def _split(self, parts: Sequence[str]) -> tuple[list[str], list[str], Sequence[int], list[int]]:
        """A row's tokens, varying tokens, their positions, and where each part starts in the tokens (a
        last entry at the end), part by part: a part every row repeats (an instruction field, a system
        prompt) is tokenised and masked once."""
        if len(parts) == 1:
            toks, v, pos = self._part(parts[0])  # (shared with the cache: callers read, never change them)
            return toks, v, pos, [0, len(toks)]
        toks: list[str] = []
        v: list[str] = []
        pos: list[int] = []
        starts = [0]
        for part in parts:
            t, pv, pp = self._part(part)
            pos += [p + len(toks) for p in pp]
            toks += t
            v += pv
            starts.append(len(toks))
        return toks, v, pos, starts

    def _part(self, part: str) -> tuple[list[str], list[str], Sequence[int]]:
        hit = self._parts.get(part)
        if hit is None:
            toks = tokens(part)
            hit = (toks, *self.boilerplate.varying(toks))
            if len(part) < 2000:  # short parts repeat; long ones rarely do
                if len(self._parts) >= 20_000:
                    self._parts.clear()
                self._parts[part] = hit
        return hit

    def _token_hit(self, toks: list[str], v: list[str], pos: Sequence[int], starts: list[int]) -> Judged:
        """The first overlap with test, else with validation, else None: a training row that overlaps
        both must be reported as test text (its example is withheld); ``_rank`` orders the rest. With
        the frames the row fills (every one: whether another row fills one is known only of them all)."""
        found: _Seen | None = None
        fills: set[str] = set()
        for seen in self._token_hits(toks, v, pos, starts):
            if seen.fill is not None:
                fills.add(seen.fill)
            if seen.how is None:
                continue
            if seen.split == "test" and seen.how != RENAMED:
                return Judged((seen.split, seen.how), tuple(sorted(fills)))  # (its other fills not looked for)
            if found is None or self._rank(seen) < self._rank(found):
                found = seen
        if found is None:
            return Judged(None, tuple(sorted(fills)))
        return Judged((found.split, found.how), tuple(sorted(fills)), found.fill if found.how == RENAMED else None)

    def _rank(self, hit: Hit | _Seen) -> tuple[bool, bool]:
        """Which of a row's overlaps it is reported as (smallest first): test before validation, and a
        copy before a renamed copy (a row that holds one input whole is that input's copy); where
        renamed copies are kept, any other overlap before a renamed copy, whichever the split."""
        weak, val = hit[1] == RENAMED, hit[0] != "test"
        return (weak, val) if self.renamed != "remove" else (val, weak)

    def _weak(self, hit: Hit | None) -> bool:
        """A renamed copy where renamed copies are kept: any other overlap (a near-duplicate) replaces it."""
        return hit is not None and hit[1] == RENAMED and self.renamed != "remove"

    def _token_hits(self, toks: list[str], v: list[str], pos: Sequence[int], starts: list[int]):
        if not v:
            return
        n = self.n
        pairs = list(zip(v, v[1:], strict=False))
        pending: dict[int, str] = {}  # a short input's n-grams found: unless the row is that input with one
        # token changed, which the renamed rule judges (a shared parameter list is most of a signature's n-grams)
        if len(v) >= n and self.grams:
            grams, gram_starts = self.grams, self.gram_starts
            at: dict[int, list[int]] = {}  # input -> where its n-grams start in v
            for i in [i for i, p in enumerate(pairs[: len(v) - n + 1]) if p in gram_starts]:
                for j in grams.get(tuple(v[i : i + n]), ()):
                    at.setdefault(j, []).append(i)
            for j, found in at.items():  # (a gram repeated in u counts once per repeat: rare, harmless)
                split, total, size, which = self.long[j]
                if len(found) < self.min_overlap * total:
                    continue
                if size >= 2 * n:
                    yield _Seen(split, f"{n}-grams", which)
                # a short input's n-grams, like its whole run of tokens, count where they carry the question
                elif covers({k for i in found for k in range(i, i + n)}, pos, starts, self.share):
                    pending[which] = split
        anchored = self._anchored(toks, v, pos, starts, pairs)
        if not pending:
            yield from anchored
            return
        seen = list(anchored)
        judged = {s.input for s in seen if s.fill is not None}  # the inputs this row is with one token changed
        yield from (_Seen(split, f"{n}-grams", j) for j, split in pending.items() if j not in judged)
        yield from seen

    def _anchored(self, toks: list[str], v: list[str], pos: Sequence[int], starts: list[int],
                  pairs: list) -> Iterator[_Seen]:
        """What the row's anchors find: its overlaps, and where the row is an input with one token
        changed, the frame it fills (the renamed rule judges whether it is a copy)."""
        anchors = self.anchors
        fields = pieces_of(pos, starts)  # the row's varying tokens, field by field (those that have some)
        keys = list(enumerate(pairs))
        if self.single:  # some inputs are one token: their anchor is that token
            keys += enumerate(v)
        for i, key in [(i, key) for i, key in keys if key in anchors]:
            for j, offset in anchors[key]:
                e = self.inputs[j]
                spans = self._align(e, toks, v, i, offset, pos, starts, fields)
                if spans is None and len(e.pieces) == 1:  # masked apart (a value common enough to be in a
                    # shared phrase in one and not the other): the whole field, token for token
                    spans = self.evidence.renamed(e, toks, [pos[i] - (e.where[offset] - e.where[0])], starts)
                if spans is None:
                    continue
                found, spans, filled = spans
                size = len(e.varying)
                anywhere = size >= 2 * self.n  # a long input carries its question wherever it is
                if found != "same":
                    copy = found == "renamed" and (anywhere or all(carries(*span, pos, starts, self.share)
                                                                   for span in spans))
                    yield _Seen(e.split, RENAMED if copy else None, j, filled)
                elif size == len(v):
                    yield _Seen(e.split, "same input", j)
                elif size >= self.min_tokens and self.evidence.says_which(e):
                    if anywhere or all(carries(*span, pos, starts, self.share) for span in spans):
                        yield _Seen(e.split, "contains a whole input", j)
                elif all(carries(*span, pos, starts, 1.0) for span in spans):
                    # the fields hold it and nothing else that varies
                    yield _Seen(e.split, "contains a whole input", j)
                elif (len(e.pieces) == 1 and spans[0][1] - spans[0][0] == len(e.full)
                      and carries(*spans[0], pos, starts, self.share)):
                    # (almost) nothing of it varies: the whole input, shared text and all, found where it
                    # carries the question
                    yield _Seen(e.split, "contains a whole input", j)

    def _align(self, e: Input, toks: list[str], v: list[str], i: int, offset: int, pos: Sequence[int],
               starts: list[int], fields: tuple[tuple[int, int], ...]):
        """Where the evaluation input ``e`` lies in a training row's varying tokens ``v``, given that its
        anchor at ``offset`` sits at ``v[i]``: ("same" | "renamed", the span in the row's tokens of each of
        its pieces, widened over the input's own shared text around it: a docstring's masked "Return"
        is part of the copy), else None. The anchor's piece lies where the anchor says; an input of several fields
        (a chat turn and the next) has each other piece in the field before or after, anywhere in it, so
        that text added around one piece (a lead-in, a closing remark) does not hide the copy."""
        k = next(k for k, (lo, hi) in enumerate(e.pieces) if lo <= offset < hi)
        lo, hi = e.pieces[k]
        at = {k: i - (offset - lo)}
        if at[k] < 0 or at[k] + hi - lo > len(v):
            return None
        if len(e.pieces) > 1:
            field_of = [bisect_right(fields, (x, len(v))) - 1 for x in (at[k],)]  # the field the anchor is in
            for step, order in ((1, range(k + 1, len(e.pieces))), (-1, range(k - 1, -1, -1))):
                f = field_of[0]
                for m in order:
                    f += step  # the next (or previous) field: each other piece lies in it, anywhere
                    if not 0 <= f < len(fields):
                        return None
                    lo_f, hi_f = fields[f]
                    piece, within = e.varying[e.pieces[m][0] : e.pieces[m][1]], v[:hi_f]
                    spots = range(lo_f, hi_f - len(piece) + 1)  # the piece itself first, else renamed
                    hit = next((x for x in spots if aligned(piece, within, x) == "same"),
                               next((x for x in spots if aligned(piece, within, x)), None))
                    if hit is None:
                        return None
                    at[m] = hit
        # the input's pieces, side by side, against the row's tokens where they were found
        joined = [v[at[m] + x] for m in range(len(e.pieces)) for x in range(e.pieces[m][1] - e.pieces[m][0])]
        found = aligned(e.varying, joined, 0)  # (a word of the task's structure changed: ``Evidence.renamed`` judges)
        if found is None:
            return None
        firsts = [pos[at[m]] for m in range(len(e.pieces))]
        if found == "renamed" or (len(e.varying) < 2 * self.n  # (a long input says which it is itself)
                                  and values_differ(e, toks, firsts, starts, self.evidence.value_for_value)):
            return self.evidence.renamed(e, toks, firsts, starts)  # one value changed and enough left alike: a copy
        spans, kept = widened(e, toks, firsts, [pos[at[m] + hi - lo - 1] + 1 for m, (lo, hi) in enumerate(e.pieces)],
                              starts)
        if len(e.varying) < 2 * self.n and kept != list(e.parts):
            # a short input's varying text without the whole of its fields: the input with its shared
            # text changed around it (`with open(os_helper.TESTFN, 'wb') as file:` holds all that varies
            # of `with self.open(os_helper.TESTFN, encoding="utf-8") as f:`): one token changed, the
            # renamed rule judges; more, a copy only where what is left alike is improbable by chance
            judged = self.evidence.renamed(e, toks, firsts, starts)
            if judged is not None:
                return judged
            if self.evidence.rare_rows and not self.evidence.improbable(e, kept, spans, starts):
                return None
        return found, spans, None
