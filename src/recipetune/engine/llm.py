"""The ``llm`` proposer: any OpenAI-compatible chat endpoint as the Researcher.

It is given a compressed view of the tree (the node's path, its siblings, the best and the failed
nodes) and held to a JSON schema: sent as structured output (``response_format``) where the server
supports it, demanded in the prompt where it does not. Its answer is data: every item is parsed and
checked against the campaign's space here (and again by the guard); an unusable answer is fed back
with the reasons and asked again, up to ``search.llm.retries`` times. Nothing it says is ever executed.

The transport is the official ``openai`` client (the ``llm`` extra), with its own retries, backoff
and timeouts for connection errors and overloaded servers (``search.llm.transport_retries``). Where
every answer stays unusable, engine/proposers.py's ``WithFallback`` lets the analyst (or random) propose.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from recipetune.core.recipe import KnobError, Recipe, Scalar
from recipetune.engine.config import LLMSettings
from recipetune.engine.researcher import Proposal, SearchContext, fresh_recipe, member, with_note
from recipetune.engine.status import Status
from recipetune.engine.tree import Node

# Values reach a trainer's argv or environment. They are matched against the space anyway; a value
# carrying any of these is refused by name so the record says why.
SHELL_META = re.compile(r"[;&|$`<>\\!*?(){}\[\]'\"\n\r\t]")

SYSTEM_PROMPT = """You are the researcher of a training-recipe search. Goal: {goal}. You see the
experiment tree around one node and propose the next experiments as edits of that node's recipe.
Answer with JSON only, exactly this shape, nothing else:
{{"proposals": [{{"edits": {{"<knob>": <value>}}, "rationale": "<one sentence>"}}]}}
Use only the knobs and values listed in "space". Do not repeat a recipe already measured.
"relations" must hold between knobs: an edit that breaks one is repaired by moving other knobs of it;
"derived" knobs follow from others and are never edited; "meanings" say what a trainer's knob is.
Answer {{"proposals": []}} if you have nothing new to propose from this node."""

RETRY_PROMPT = """Your answer could not be used:
{reasons}
Answer again, JSON only, exactly the shape asked for, with knobs and values from "space" and recipes
not already measured (or {{"proposals": []}} if you have nothing new)."""


def _node_view(node: Node, baseline: Recipe, score_name: str) -> dict[str, Any]:
    view: dict[str, Any] = {"changes": node.recipe.edits_from(baseline),
                            "status": node.status}
    if node.score is not None:
        view[score_name] = round(node.score, 4)
    if node.cause:
        view["cause"] = node.cause[:200]
    return view


def _gain(node: Node) -> float:
    """A node's improvement on its parent, in the job's score."""
    if node.score is None or node.parent is None or node.parent.score is None:
        return -float("inf")
    return node.score - node.parent.score


def compress_context(node: Node, context: SearchContext, k: int, n_key: int = 3) -> dict[str, Any]:
    """TREX's compressed context: the node (with the job's ``details``, e.g. its worst cases), its
    path to the root, its siblings, and the globally key nodes (best, biggest gains on their parent,
    latest failures). At most ``context.max_chars`` of JSON: the lists lose their farthest items first."""
    tree, baseline = context.tree, context.baseline
    facts = context.facts_of(node)
    profile = {n: round(v, 4) if isinstance(v, float) else v for n, v in facts.items()
               if n in context.profile and v is not None}

    def view(n: Node) -> dict[str, Any]:
        return _node_view(n, baseline, context.score_name)

    rel = context.relations
    gains = sorted((n for n in tree if n.status == Status.PASSED and _gain(n) > 0), key=_gain, reverse=True)
    out: dict[str, Any] = {
        "space": {n: list(v) for n, v in context.space.values.items()},
        **({"relations": [r.expr for r in rel.relations]} if rel.relations else {}),
        **({"derived": dict(rel.derived)} if rel.derived else {}),
        **({"meanings": dict(context.glossary.word_of)} if context.glossary.word_of else {}),
        "baseline": {n: baseline[n] for n in context.space.values if n in baseline},
        "node": {**view(node), "profile": profile, **(context.details(node) if context.details else {})},
        "path": [view(n) | {"rationale": n.rationale[:160]} for n in tree.path(node)[:-1]],
        "siblings": [view(n) for n in tree.siblings(node)],
        "best": [view(n) for n in tree.ranked()[:n_key]],
        "gains": [view(n) | {"gain_on_parent": round(_gain(n), 4)} for n in gains[:n_key]],
        "failures": [view(n) for n in tree.failures()[-n_key:]],
        "k": k,
    }
    # Within the stated size: drop the farthest ancestors, the siblings, the key nodes' tails, and
    # then the node's details, one item at a time, until it fits.
    trims = [("path", 0), ("siblings", -1), ("failures", 0), ("gains", -1), ("best", -1)]
    while len(json.dumps(out, separators=(",", ":"), default=str)) > context.max_chars:
        for key, end in trims:
            if out[key]:
                out[key].pop(end)
                break
        else:
            for value in out["node"].values():
                if isinstance(value, list) and value:
                    value.pop()
                    break
            else:
                break  # nothing left to trim: the space itself is that large
    return out


MISSING_CLIENT = ("search.proposer: llm needs the openai client, an optional extra: pip install 'recipetune[llm]' "
                  "(or choose proposer analyst or random)")


def api_base(base_url: str) -> str:
    """The client's base URL: it adds /chat/completions itself (a full endpoint URL is accepted too)."""
    base = base_url.rstrip("/")
    return base.removesuffix("/chat/completions")


def answer_schema(context: SearchContext, k: int) -> dict[str, Any]:
    """The JSON schema of an answer, for structured output: at most ``k`` proposals, each editing
    searched, non-derived knobs to values the space lists. A server that enforces it (guided
    decoding) can only say what the checks below accept; one that does not is still checked."""
    knobs = context.workload.knobs()
    editable = {name: {"enum": list(values)} for name, values in context.space.values.items()
                if name in knobs and not knobs[name].derive}
    proposal = {"type": "object", "additionalProperties": False, "required": ["edits", "rationale"],
                "properties": {"edits": {"type": "object", "additionalProperties": False, "minProperties": 1,
                                         "properties": editable},
                               "rationale": {"type": "string"}}}
    return {"type": "object", "additionalProperties": False, "required": ["proposals"],
            "properties": {"proposals": {"type": "array", "maxItems": k, "items": proposal}}}


def refuses_structured_output(error: Exception) -> bool:
    """A 400 (or 422) that is about response_format: the server cannot do structured output."""
    status = getattr(error, "status_code", None)
    if status not in (400, 422):
        return False
    text = f"{getattr(error, 'message', '')} {json.dumps(getattr(error, 'body', None), default=str)}".lower()
    return any(word in text for word in ("response_format", "json_schema", "unsupported", "not supported"))


def describe_error(error: Exception) -> str:
    status = getattr(error, "status_code", None)
    if status is not None:  # openai.APIStatusError: the server answered with an error
        body = getattr(error, "body", None)  # the client keeps the payload's "error" object
        said = body.get("message") if isinstance(body, dict) else None
        return f"HTTP {status}: {str(said if isinstance(said, str) else getattr(error, 'message', error))[:300]}"
    return f"{type(error).__name__}: {str(error)[:300]}"


class LLMProposer:
    name = "llm"

    def __init__(self, settings: LLMSettings):
        self.base_url = settings.base_url or os.environ.get("RECIPETUNE_LLM_BASE_URL", "")
        self.model = settings.model or os.environ.get("RECIPETUNE_LLM_MODEL", "default")
        self.api_key = settings.api_key or os.environ.get("RECIPETUNE_LLM_API_KEY")
        self.timeout_s, self.temperature = settings.timeout_s, settings.temperature
        self.retries = settings.retries
        # None: not tried yet; False: the server refused it, asked without for the rest of the campaign.
        self.structured: bool | None = None if settings.structured else False
        try:
            import openai
        except ImportError:
            raise ValueError(MISSING_CLIENT) from None
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError("search.llm.base_url (or RECIPETUNE_LLM_BASE_URL) must be an http(s) URL, "
                             f"got {self.base_url!r}")
        self.openai = openai
        # The client wants a key; a local server (vLLM, llama.cpp, Ollama) takes any, so a placeholder.
        self.client = openai.OpenAI(base_url=api_base(self.base_url), api_key=self.api_key or "EMPTY",
                                    timeout=self.timeout_s, max_retries=settings.transport_retries)

    def ask(self, messages: list[dict[str, str]], schema: dict[str, Any]) -> str:
        """One answer's text. Transport errors are retried by the client; what is left raises."""
        request: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.structured is not False:
            # strict: False because "edits" holds any subset of the knobs, and strict mode requires every
            # property; servers that enforce schemas (vLLM, SGLang, llama.cpp) enforce this one anyway.
            schema_format = {"type": "json_schema",
                             "json_schema": {"name": "proposals", "schema": schema, "strict": False}}
            try:
                reply = self.client.chat.completions.create(**request, response_format=schema_format)
            except self.openai.APIStatusError as e:
                if not refuses_structured_output(e):
                    raise
                self.structured = False  # remembered: no campaign-long 400 per question
            else:
                self.structured = True
                return self.content(reply)
        return self.content(self.client.chat.completions.create(**request))

    @staticmethod
    def content(reply: Any) -> str:
        text = reply.choices[0].message.content
        if not isinstance(text, str):  # a refusal, or a server that sent no message text
            refusal = getattr(reply.choices[0].message, "refusal", None)
            raise ValueError(f"no message content{f' (refusal: {refusal})' if refusal else ''}")
        return text

    def propose(self, node: Node, context: SearchContext, k: int) -> list[Proposal]:
        """Ask; an answer with nothing usable is asked again, up to ``retries`` times, with the reasons
        fed back. An empty answer ({"proposals": []}) is the Researcher's own: nothing new here. Where
        every answer was unusable, ``context.failed`` says so for the node (read by WithFallback and
        the loop)."""
        view = compress_context(node, context, k)
        schema = answer_schema(context, k)
        messages = [{"role": "system", "content": SYSTEM_PROMPT.format(goal=context.goal)},
                    {"role": "user", "content": json.dumps(view, separators=(",", ":"))}]
        reasons: list[str] = []
        for _ in range(1 + self.retries):
            before = len(context.rejections)
            try:
                content = self.ask(messages, schema)
            except (self.openai.OpenAIError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                context.reject(self.name, f"endpoint error: {describe_error(e)}")
                reasons = [context.rejections[-1].reason]
                continue  # nothing to show the model: the same question again
            out = self.read_answer(content, node, context, k)
            if out:
                context.failed.pop(node.id, None)
                return out
            reasons = [r.reason for r in context.rejections[before:]]
            if not reasons:
                context.failed.pop(node.id, None)
                return []  # an empty answer: nothing new to propose from this node
            messages += [{"role": "assistant", "content": content[:4000]},
                         {"role": "user", "content": RETRY_PROMPT.format(
                             reasons="\n".join(f"- {r}" for r in dict.fromkeys(reasons)))}]
        asked = 1 + self.retries
        context.failed[node.id] = f"{asked} answer{'s' if asked > 1 else ''}, none usable; last: {'; '.join(reasons)}"
        return []

    def read_answer(self, content: str, node: Node, context: SearchContext, k: int) -> list[Proposal]:
        """The usable proposals of one answer; every unusable item is recorded with its reason."""
        items = parse_answer(content, context, self.name)
        out: list[Proposal] = []
        taken: set[str] = set()
        for item in items:
            edits = check_edits(item["edits"], context, self.name)
            if edits is None:
                continue
            fresh = fresh_recipe(node, edits, context, taken, source=self.name)
            if fresh is None:
                context.reject(self.name, "already measured (or no change from the node)", item)
                continue
            recipe, edits, note = fresh
            taken.add(recipe.id)
            rationale = " ".join(str(item["rationale"]).split())[:300]
            out.append(Proposal(edits, with_note(rationale, note), self.name))
            if len(out) == k:
                break
        return out


def parse_answer(content: str, context: SearchContext, source: str) -> list[dict[str, Any]]:
    """The answer's proposal objects; a malformed answer or item is recorded and dropped."""
    text = content.strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)  # chat models like fences
    if fence:
        text = fence.group(1)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        context.reject(source, f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}", content)
        return []
    items = data.get("proposals") if isinstance(data, dict) else data
    if not isinstance(items, list):
        context.reject(source, 'answer does not match the schema {"proposals": [...]}', content)
        return []
    good = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"edits", "rationale"}:
            context.reject(source, "proposal must be an object with exactly 'edits' and 'rationale'", item)
        elif not isinstance(item["edits"], dict) or not item["edits"]:
            context.reject(source, "'edits' must be a non-empty object of knob: value", item)
        elif not isinstance(item["rationale"], str):
            context.reject(source, "'rationale' must be a string", item)
        else:
            good.append(item)
    return good


def check_edits(edits: dict[str, Any], context: SearchContext, source: str) -> dict[str, Scalar] | None:
    """Edits coerced to the knobs' types, or None (recorded) if any one is not allowed."""
    knobs = context.workload.knobs()
    out: dict[str, Scalar] = {}
    for name, value in edits.items():
        if name not in knobs:
            context.reject(source, f"unknown knob '{name}'", edits)
            return None
        if knobs[name].derive:
            context.reject(source, f"knob '{name}' is derived from '{knobs[name].derive}'; edit the knobs it "
                                   "follows instead", edits)
            return None
        if name not in context.space.values:
            allowed = ", ".join(context.space.values)
            context.reject(source, f"knob '{name}' is not searched in this campaign (searched: {allowed})", edits)
            return None
        if isinstance(value, str) and SHELL_META.search(value):
            context.reject(source, f"knob '{name}': shell metacharacters in value {value!r}", edits)
            return None
        if not isinstance(value, bool | int | float | str) or (isinstance(value, float) and not math.isfinite(value)):
            context.reject(source, f"knob '{name}': {value!r} is not a scalar value", edits)
            return None
        try:
            value = knobs[name].validate(value)
        except KnobError as e:
            context.reject(source, f"out-of-domain: {e}", edits)
            return None
        if not member(value, context.space.values[name]):
            listed = ", ".join(json.dumps(v) for v in context.space.values[name])
            context.reject(source, f"out-of-domain: knob '{name}': {value!r} is not in the space ({listed})", edits)
            return None
        out[name] = value
    return out
