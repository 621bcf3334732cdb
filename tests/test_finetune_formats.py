"""Task formats: the dataset shapes and their renderings, the files they come in (columns keep their
types), the checks at load (a missing answer names file, line and field; or is dropped and counted),
and the recipe knobs a route or this machine may refuse: precision, activation checkpointing, LoRA
presets per architecture, and a chat template on the HF route."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from ft_fixtures import SYSTEM, experiment_file, shaped_rows, shaped_task, tiny_llama, write_jsonl
from pydantic import ValidationError
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.core.errors import ConfigError
from recipetune.data.files import DataFileError
from recipetune.finetune.experiment import load_experiment, prepare_data, run_experiment
from recipetune.finetune.recipe import TrainRecipe, lora_modules
from recipetune.finetune.task import Splits, TaskConfig, TaskError

runner = CliRunner()
NAMES = {"train": "train.jsonl", "validation": "val.jsonl", "test": "test.jsonl"}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": " 6 "}]


def task(**fields) -> TaskConfig:
    return TaskConfig(files=NAMES, **fields)


def shaped_file(folder: Path, files: dict[str, Path], model: dict, shape: str, **task_fields) -> Path:
    spec = {"name": shape, "format": shape, "files": {k: str(v) for k, v in files.items()},
            "generation": {"max_new_tokens": 4}, **task_fields}
    return experiment_file(folder, files, model, task=spec, data=[])


# -- shapes ------------------------------------------------------------------------------------------


def test_each_shape_renders_its_prompt_answer_and_varying_parts():
    t = task(prompt="Q: {a} + {b} =", target="sum")
    row = {"a": 2, "b": 3, "sum": 5}  # typed values: rendered, never cast in the row
    assert (t.render(row), t.answer(row), t.input_parts(row), t.messages(row)) == ("Q: 2 + 3 =", "5", ["2", "3"], None)

    i = task(format="instruction")
    row = {"instruction": "Add the numbers.", "input": "2 3", "output": "5"}
    assert i.render(row) == "### Instruction:\nAdd the numbers.\n\n### Input:\n2 3\n\n### Response:\n"
    assert i.answer(row) == "5" and i.input_parts(row) == ["Add the numbers.", "2 3"] and i.target == "output"
    assert i.render({"instruction": "Say hi.", "input": ""}) == "### Instruction:\nSay hi.\n\n### Response:\n"

    c = task(format="chat")
    row = {"messages": CHAT}
    assert c.render(row) == "System: Be brief.\nUser: 2+2?\nAssistant: 4\nUser: and 3+3?\nAssistant: "
    assert c.answer(row) == "6" and c.messages(row) == CHAT[:-1]
    assert c.input_parts(row) == ["Be brief.", "2+2?", "4", "and 3+3?"]  # the system prompt included
    # a CSV cell holds the list as JSON text, or as the Python literal pandas writes
    assert c.answer({"messages": json.dumps(CHAT)}) == c.answer({"messages": str(CHAT)}) == "6"

    p = task(format="completion")
    row = {"prompt": "2+2=", "completion": "4"}
    assert (p.render(row), p.answer(row), p.input_parts(row)) == ("2+2=", "4", ["2+2="])
    conv = {"prompt": CHAT[:2], "completion": [{"role": "assistant", "content": "4"}]}  # TRL's conversational form
    assert p.render(conv) == "System: Be brief.\nUser: 2+2?\nAssistant: " and p.answer(conv) == "4"
    assert p.messages(conv) == CHAT[:2] and p.input_parts(conv) == ["Be brief.", "2+2?"]
    as_text = {k: str(v) for k, v in conv.items()}  # a CSV cell, or a row the data chain stringified
    assert p.messages(as_text) == CHAT[:2] and p.answer(as_text) == "4"
    assert p.answer({"prompt": CHAT[:2], "completion": "4"}) == "4"  # a text answer to a conversation
    assert p.messages({"prompt": "[see above] 2+2=", "completion": "4"}) is None  # text, though it opens with [


@pytest.mark.parametrize("fields, message", [
    ({"prompt": "{q}"}, "format template needs prompt"),
    ({"format": "chat", "prompt": "{q}"}, "format chat renders its own prompt"),
    ({"format": "json"}, "template"),
    ({"format": "instruction", "incomplete_rows": "skip"}, "error"),
])
def test_a_shape_refuses_fields_it_does_not_read(fields, message):
    with pytest.raises(ValidationError, match=message):
        task(**fields)


# -- files -------------------------------------------------------------------------------------------


def _write(kind: str, folder: Path, splits: dict[str, list[dict]]) -> dict[str, Path]:
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    if kind == "dataset_dict":
        datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in splits.items()}).save_to_disk(folder / "dd")
        return dict.fromkeys(splits, folder / "dd")  # one folder: each split reads its own
    out = {}
    for split, rows in splits.items():
        ds = datasets.Dataset.from_list(rows)
        path = folder / f"{split}.{ {'save_to_disk': 'ds'}.get(kind, kind)}"
        if kind == "jsonl":
            write_jsonl(path, rows)
        elif kind == "csv":  # a cell cannot hold a list: the messages as JSON text
            datasets.Dataset.from_list([{"messages": json.dumps(r["messages"])} for r in rows]).to_csv(str(path))
        elif kind == "parquet":
            ds.to_parquet(str(path))
        else:
            ds.save_to_disk(path)
        out[split] = path
    return out


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "save_to_disk", "dataset_dict"])
def test_every_file_kind_loads_a_chat_task_with_its_columns_typed(tmp_path, kind):
    rows = {"train": shaped_rows(["kilo", "lima", "mike"], "chat"), "validation": shaped_rows(["alpha"], "chat"),
            "test": shaped_rows(["bravo", "charlie"], "chat")}
    paths = _write(kind, tmp_path, rows)
    splits = Splits(task(format="chat"), paths)
    assert [len(splits.train), len(splits.validation)] == [3, 1] and splits.conversational
    first = splits.train[0]["messages"]
    assert isinstance(first, str) if kind == "csv" else first[1] == {"role": "user", "content": "kilo"}
    assert splits.task.answer(splits.train[0]) == "olik"
    assert splits.task.input_parts(splits.train[0]) == [SYSTEM, "kilo"]
    if kind == "dataset_dict":  # the folder stands for the split of the same name
        assert splits.paths["validation"] == tmp_path / "dd" / "validation"
    assert len(set(splits.fingerprints.values())) == 3


def test_a_dataset_dict_without_the_split_names_the_ones_it_has(tmp_path):
    import datasets

    words = {"train": ["kilo"], "dev": ["alpha"], "test": ["bravo"]}
    datasets.DatasetDict({s: datasets.Dataset.from_list(shaped_rows(w, "plain"))
                          for s, w in words.items()}).save_to_disk(tmp_path / "dd")
    t = task(prompt="{word}", target="answer")
    with pytest.raises(DataFileError) as e:
        Splits(t, dict.fromkeys(("train", "validation", "test"), tmp_path / "dd"))
    assert e.value.field == "task.files.validation" and "splits: train, dev, test" in str(e.value)
    assert str(tmp_path / "dd" / "train") in str(e.value)
    splits = Splits(t, {"train": tmp_path / "dd", "validation": tmp_path / "dd" / "dev", "test": tmp_path / "dd"})
    assert splits.validation[0]["word"] == "alpha"


def test_typed_columns_are_not_cast(tmp_path):
    rows = [{"a": i, "b": [i, i + 1], "sum": 2 * i + 1} for i in range(1, 4)]
    paths = {s: write_jsonl(tmp_path / f"{s}.jsonl", [r | {"a": r["a"] + 10 * k}]) for k, (s, r)
             in enumerate(zip(("train", "validation", "test"), rows, strict=True))}
    splits = Splits(task(prompt="{a} {b}", target="sum"), paths)
    assert splits.train[0] == {"a": 1, "b": [1, 2], "sum": 3} and splits.task.render(splits.train[0]) == "1 [1, 2]"


# -- checks at load ----------------------------------------------------------------------------------


def _bad(tmp_path: Path, kind: str):
    """A training file with one bad row among good ones; the row's expected position in the message."""
    good = shaped_rows(["kilo", "lima"], "plain")
    val, test = shaped_rows(["alpha"], "plain"), shaped_rows(["bravo"], "plain")
    files = {"validation": write_jsonl(tmp_path / "val.jsonl", val), "test": write_jsonl(tmp_path / "test.jsonl", test)}
    if kind == "jsonl missing target":  # a blank line before it: the line, not the row, is named
        (tmp_path / "train.jsonl").write_text(json.dumps(good[0]) + "\n\n" + json.dumps({"word": "mike"}) + "\n")
        return files | {"train": tmp_path / "train.jsonl"}, "task.target", "line 3", "'answer' is missing"
    if kind == "csv empty target":  # a quoted cell over two lines before it
        (tmp_path / "train.csv").write_text('word,answer\n"ki\nlo",olik\nmike,\n')
        return files | {"train": tmp_path / "train.csv"}, "task.target", "line 4", "'answer' is"
    if kind == "parquet empty target":
        import datasets

        rows = good + [{"word": "mike", "answer": "  "}]
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
        return files | {"train": tmp_path / "train.parquet"}, "task.target", "row index 2", "'answer' is empty"
    if kind == "missing prompt field":
        write_jsonl(tmp_path / "train.jsonl", good + [{"word": None, "answer": "x"}])
        return files | {"train": tmp_path / "train.jsonl"}, "task.prompt", "line 3", "column 'word' is missing"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["jsonl missing target", "csv empty target", "parquet empty target",
                                  "missing prompt field"])
def test_a_row_without_answer_or_prompt_is_an_error_naming_file_line_and_field(tmp_path, kind):
    files, field, where, what = _bad(tmp_path, kind)
    with pytest.raises(TaskError) as e:
        Splits(task(prompt="reverse {word}: ", target="answer"), files)
    assert e.value.field == field and f"{files['train']} {where}" in str(e.value) and what in str(e.value)
    assert "incomplete_rows: drop" in str(e.value)


@pytest.mark.parametrize("messages, field, what", [
    ([{"role": "user", "content": "hi"}], "task.target", "ends with a user message"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}], "task.target", "is empty"),
    ([{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}], "task.target", "role one of"),
    ([], "task.target", "non-empty list"),
])
def test_a_conversation_without_a_final_answer_is_an_error(tmp_path, messages, field, what):
    files = shaped_task(tmp_path, "chat", n_train=4)
    rows = [json.loads(line) for line in files["train"].read_text().splitlines()]
    write_jsonl(files["train"], rows[:2] + [{"messages": messages}] + rows[2:])
    with pytest.raises(TaskError) as e:
        Splits(task(format="chat"), files)
    assert e.value.field == field and f"{files['train']} line 3" in str(e.value) and what in str(e.value)


def test_bad_rows_exit_2_from_the_cli_and_write_nothing(tiny_ft):
    tmp_path, files, model = tiny_ft
    rows = [json.loads(line) for line in files["train"].read_text().splitlines()]
    write_jsonl(files["train"], rows[:5] + [{**rows[5], "answer": ""}] + rows[6:])
    path = experiment_file(tmp_path, files, model)
    for cmd in ("ft", "data"):
        out = tmp_path / f"never-{cmd}"
        res = runner.invoke(app, [cmd, "run", str(path), "--out", str(out)])
        text = " ".join(res.output.split()).replace(" ", "")
        assert res.exit_code == 2 and "task.target" in text and "train.jsonlline6" in text, res.output
        assert not out.exists() and "Traceback" not in res.output


def test_drop_mode_drops_the_rows_and_counts_them_per_split_and_reason(tmp_path):
    files = shaped_task(tmp_path, "chat", n_train=6)
    train = [json.loads(line) for line in files["train"].read_text().splitlines()]
    no_answer = {"messages": train[0]["messages"][:2]}
    empty = {"messages": train[0]["messages"][:2] + [{"role": "assistant", "content": ""}]}
    write_jsonl(files["train"], train + [no_answer, empty, no_answer])
    val = [json.loads(line) for line in files["validation"].read_text().splitlines()]
    write_jsonl(files["validation"], val + [empty])
    splits = Splits(task(format="chat", incomplete_rows="drop"), files)
    assert splits.dropped == {"train": {"no final assistant message": 2, "empty target": 1},
                              "validation": {"empty target": 1}}
    assert len(splits.train) == 6 and len(splits.validation) == 4
    assert all(splits.task.problem(r) is None for r in splits.train)
    write_jsonl(files["validation"], [empty])
    with pytest.raises(TaskError, match="every row was dropped") as e:
        Splits(task(format="chat", incomplete_rows="drop"), files)
    assert e.value.field == "task.incomplete_rows"


def test_a_chain_step_that_removes_the_answer_is_refused(tiny_ft):
    tmp_path, files, model = tiny_ft
    exp = load_experiment(experiment_file(tmp_path, files, model, data=[{"op": "convert", "keep": ["word", "id"]}]))
    with pytest.raises(ConfigError) as e:
        prepare_data(exp)
    assert e.value.field == "data" and "'answer' is missing" in e.value.message


# -- knobs a route or this machine cannot honour -----------------------------------------------------


def _no_cuda(monkeypatch, bf16: bool | None = None):
    """This machine as CPU-only (bf16=None), or with a CUDA GPU with or without bf16."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bf16 is not None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bool(bf16))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla T4")


def test_precision_is_refused_where_the_device_cannot_run_it(tiny_ft, monkeypatch):
    tmp_path, files, model = tiny_ft
    llama = {"kind": "hf", "path": str(tiny_llama(tmp_path / "llama", files))}
    _no_cuda(monkeypatch)
    for m, expected in ((model, "loss scaling"), (llama, "fp16 needs a CUDA GPU")):
        with pytest.raises(ConfigError) as e:
            load_experiment(experiment_file(tmp_path, files, m), ["precision=fp16"])
        assert e.value.field == "recipe.precision" and expected in e.value.message
        assert load_experiment(experiment_file(tmp_path, files, m), ["precision=bf16"]).spec.recipe.precision == "bf16"
    _no_cuda(monkeypatch, bf16=False)
    with pytest.raises(ConfigError, match="Tesla T4 has no bf16"):
        load_experiment(experiment_file(tmp_path, files, llama), ["precision=bf16"])
    # a child of the search is refused the same way (Experiment checks every child)
    _no_cuda(monkeypatch)
    exp = load_experiment(experiment_file(tmp_path, files, llama))
    with pytest.raises(ConfigError) as e:
        exp.derive(recipe={"precision": "fp16"})
    assert e.value.field == "recipe.precision"


def test_the_search_space_has_the_knobs_and_refuses_values_the_machine_cannot_run(tiny_ft, monkeypatch):
    from recipetune.finetune import plan as ftp

    tmp_path, files, model = tiny_ft
    _no_cuda(monkeypatch)
    path = experiment_file(tmp_path, files, model, search={"knobs": {"precision": ["fp32", "bf16"],
                                                                     "gradient_checkpointing": [False, True],
                                                                     "lora_targets": ["attention", "all_linear"]},
                                                           "budget": {"trials": 2}})
    c = ftp.load_finetune_campaign(path)
    knobs = c.space.knobs()
    assert knobs["precision"].choices == ("fp32", "bf16", "fp16") and knobs["gradient_checkpointing"].role == "speed"
    assert set(ftp.check_space(c).values) == {"precision", "gradient_checkpointing", "lora_targets"}
    spec = yaml.safe_load(path.read_text())
    spec["search"]["knobs"]["precision"] = ["fp32", "fp16"]
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError) as e:
        ftp.check_space(ftp.load_finetune_campaign(path))
    assert e.value.field == "search.knobs.precision" and "'fp16'" in e.value.message


def test_hf_knobs_reach_trl_and_a_bf16_checkpointed_step_runs(tmp_path, monkeypatch):
    from recipetune.finetune.hf import sft_args

    args = sft_args(TrainRecipe(precision="bf16", gradient_checkpointing=True), tmp_path)
    assert args.bf16 and not args.fp16 and args.activation_checkpointing and args.gradient_checkpointing
    args = sft_args(TrainRecipe(), tmp_path)  # TRL's own defaults (bf16, checkpointing on) are not ours
    assert not args.bf16 and not args.fp16 and not args.activation_checkpointing
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    files = shaped_task(tmp_path, "chat", n_train=4)
    llama = {"kind": "hf", "path": str(tiny_llama(tmp_path / "llama", files))}
    # bf16 on a CPU is slow: one step only, to show TRL and the model accept it
    exp = load_experiment(shaped_file(tmp_path, files, llama, "chat"),
                          ["max_steps=1", "precision=bf16", "gradient_checkpointing=true", "max_seq_len=64"])
    report = run_experiment(exp, tmp_path / "run")
    assert report.status == "ok", report.cause
    assert report.loss.steps == 1 and report.loss.first > 0


def test_reference_route_honours_bf16_and_gradient_checkpointing(tiny_ft):
    tmp_path, files, model = tiny_ft
    exp = load_experiment(experiment_file(tmp_path, files, model),
                          ["max_steps=1", "precision=bf16", "gradient_checkpointing=true"])
    report = run_experiment(exp, tmp_path / "run")
    assert report.status == "ok" and report.loss.steps == 1 and report.loss.first > 0, report.cause


def _tiny(model_type: str):
    import transformers as T

    small = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1)
    config = {
        "llama": lambda: T.LlamaConfig(**small), "mistral": lambda: T.MistralConfig(**small),
        "qwen2": lambda: T.Qwen2Config(**small),
        "gpt2": lambda: T.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32),
        "gpt_neox": lambda: T.GPTNeoXConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2),
    }[model_type]()
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "gpt2", "gpt_neox", "reference"])
def test_lora_presets_name_real_modules_of_each_architecture(model_type):
    import warnings

    from peft import LoraConfig, inject_adapter_in_model

    from recipetune.trainer.model import Transformer, get_model_config

    counts = {}
    for preset in ("", "attention", "mlp", "all_linear"):
        reference = model_type == "reference"
        model = Transformer(get_model_config("nano", vocab_size=256)) if reference else _tiny(model_type)
        targets = lora_modules(preset, model_type)
        with warnings.catch_warnings():  # GPT-2's Conv1D: peft switches fan_in_fan_out on, and says so
            warnings.simplefilter("ignore")
            model = inject_adapter_in_model(LoraConfig(r=2, target_modules=targets), model)
        counts[preset] = sum(name.endswith("lora_A") for name, _ in model.named_modules())
        assert counts[preset] >= len(targets), (preset, targets)  # every name matched (per layer)
    assert counts["all_linear"] == counts["attention"] + counts["mlp"] > counts[""] > 0


def test_lora_presets_elsewhere_and_explicit_names():
    assert lora_modules("q_proj, v_proj", "anything") == ["q_proj", "v_proj"]
    assert lora_modules("all_linear", "opt") == "all-linear"  # peft's own: every linear layer but the head
    assert lora_modules("", "opt") == ["q_proj", "v_proj"]
    with pytest.raises(ValueError, match="no 'attention' preset for model type 'opt'"):
        lora_modules("attention", "opt")
    with pytest.raises(ValidationError, match="a preset"):
        TrainRecipe(lora_targets="q_proj;v_proj")


def test_lora_refusals_name_the_field(tiny_ft):
    import shutil

    from transformers import OPTConfig

    tmp_path, files, _ = tiny_ft
    llama = tiny_llama(tmp_path / "llama", files)
    opt = tmp_path / "opt"  # a folder check_model accepts; refused before its weights are read
    OPTConfig(hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2).save_pretrained(opt)
    (opt / "model.safetensors").write_bytes(b"")
    shutil.copy(llama / "tokenizer.json", opt)
    res = runner.invoke(app, ["ft", "run", str(experiment_file(tmp_path, files, {"kind": "hf", "path": str(opt)})),
                              "method=lora", "lora_targets=attention", "--out", str(tmp_path / "never")])
    assert res.exit_code == 2 and "recipe.lora_targets" in res.output and "'opt'" in res.output, res.output
    assert not (tmp_path / "never").exists()
    exp = load_experiment(experiment_file(tmp_path, files, {"kind": "hf", "path": str(llama)}),
                          ["method=lora", "lora_targets=c_attn"])
    with pytest.raises(ConfigError) as e:
        run_experiment(exp, tmp_path / "never")
    assert e.value.field == "recipe.lora_targets" and "q_proj" in e.value.message and "all_linear" in e.value.message
    assert not (tmp_path / "never").exists()


# -- conversations on each route ---------------------------------------------------------------------


def test_a_chat_task_needs_a_chat_template_on_the_hf_route(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    files = shaped_task(tmp_path, "chat", n_train=4)
    bare = {"kind": "hf", "path": str(tiny_llama(tmp_path / "bare", files, chat_template=None))}
    path = shaped_file(tmp_path, files, bare, "chat")
    res = runner.invoke(app, ["ft", "run", str(path), "--out", str(tmp_path / "never")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "model.path" in text and "chat template" in text and "task.format" in text, text
    assert not (tmp_path / "never").exists()
    # a text task is fine with the same tokenizer
    load_experiment(shaped_file(tmp_path, shaped_task(tmp_path, "completion", n_train=4), bare, "completion"))


def test_the_hf_route_renders_conversations_with_the_chat_template(tmp_path, monkeypatch):
    from recipetune.finetune.hf import HFRoute

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    files = shaped_task(tmp_path, "chat", n_train=4)
    exp = load_experiment(shaped_file(tmp_path, files, {"kind": "hf", "path": str(tiny_llama(tmp_path / "l", files))},
                                      "chat"))
    route = HFRoute(exp.spec.model, exp.base_dir, exp.spec.recipe)
    row = exp.splits.validation[0]
    assert route.prompt(exp.spec.task, row) == [{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": "alpha"}]
    assert route._chat_text(route.prompt(exp.spec.task, row)) == (
        f"<|system|>\n{SYSTEM}<|eos|>\n<|user|>\nalpha<|eos|>\n<|assistant|>\n")
    # over max_seq_len: the earliest contents are cut first, the answer stays
    messages = route.prompt(exp.spec.task, row)
    full = route._n_tokens(route._chat_text(messages, "ahpla\n"), special=False)
    cut, was_cut = route._cut_messages(messages, "ahpla\n", full - 2)
    assert was_cut and SYSTEM.endswith(cut[0]["content"]) and cut[0]["content"] != SYSTEM
    assert cut[1]["content"] == "alpha" and route._n_tokens(route._chat_text(cut, "ahpla\n"), special=False) <= full - 2
    assert route._cut_messages(messages, "ahpla\n", full) == (messages, False)


@pytest.mark.parametrize("shape", ["instruction", "completion", "chat"])
def test_every_shape_trains_and_is_scored_on_both_routes(tmp_path, monkeypatch, shape):
    from ft_fixtures import nano_checkpoint

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    files = shaped_task(tmp_path, shape, n_train=8)
    models = {"reference": {"kind": "reference", "path": str(nano_checkpoint(tmp_path / "nano.pt"))},
              "hf": {"kind": "hf", "path": str(tiny_llama(tmp_path / "llama", files))}}
    for route, model in models.items():
        exp = load_experiment(shaped_file(tmp_path, files, model, shape), ["max_steps=2", "max_seq_len=64"])
        report = run_experiment(exp, tmp_path / route)
        assert report.status == "ok" and report.route == route and report.validation.n_examples == 4, report.cause
        first = json.loads((tmp_path / route / "predictions.jsonl").read_text().splitlines()[0])
        assert first["target"] == "ahpla" and first["prompt"] == exp.spec.task.render(exp.splits.validation[0])


def test_hf_generation_keeps_an_answer_after_a_prompt_ending_in_the_stop_string(tmp_path, monkeypatch):
    """The instruction layout ends with "\\n", the default stop: the newline trained as the answer's start
    must not end the generated answer before it starts."""
    from recipetune.finetune.hf import HFRoute
    from recipetune.finetune.task import GenerationSettings

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    files = shaped_task(tmp_path, "instruction", n_train=4)
    exp = load_experiment(shaped_file(tmp_path, files, {"kind": "hf", "path": str(tiny_llama(tmp_path / "l", files))},
                                      "instruction"))
    route = HFRoute(exp.spec.model, exp.base_dir, exp.spec.recipe)
    answer = route.tok("\nahpla\nzzz", add_special_tokens=False, return_tensors="pt")["input_ids"]

    def generate(input_ids, **_):  # a model that has learnt the answer: newline, answer, stop
        return torch.cat([input_ids, answer.repeat(len(input_ids), 1)], dim=1)

    monkeypatch.setattr(route.model, "generate", generate)
    prompt = route.prompt(exp.spec.task, exp.splits.validation[0])
    assert prompt.endswith("### Response:\n")
    [gen] = route.generate([prompt], GenerationSettings(max_new_tokens=16))
    assert gen.text == "ahpla" and not gen.truncated


def test_csv_cells_are_read_as_written(tmp_path):
    """`None`, `NA`, `null` and `nan` in a CSV cell are text (pandas' NA guessing made a Python literal
    `None` input a missing one, trained as an instruction without input); only an empty cell is missing."""
    (tmp_path / "train.csv").write_text("instruction,input,output\nkind,None,Constant\nkind,NA,Name\n"
                                        "kind,null,Name\nkind,nan,Name\nkind,,Empty\n")
    (tmp_path / "val.csv").write_text("instruction,input,output\nkind,x[0],Subscript\n")
    (tmp_path / "test.csv").write_text("instruction,input,output\nkind,f(x),Call\n")
    files = {s: tmp_path / f"{n}.csv" for s, n in (("train", "train"), ("validation", "val"), ("test", "test"))}
    splits = Splits(task(format="instruction"), files)
    assert splits.train["input"] == ["None", "NA", "null", "nan", None]
    t = splits.task
    assert t.input_parts(splits.train[0]) == ["kind", "None"] and "### Input:\nNone" in t.render(splits.train[0])
    assert "### Input" not in t.render(splits.train[4])  # an empty cell: an instruction without input


def test_a_validation_row_in_test_names_both_lines_one_based(tmp_path):
    """The split-overlap refusal is as exact as the load checks: the 1-based line of the validation row
    (a quoted cell over two lines before it) and of the test row it repeats, case and whitespace ignored,
    and how many overlap; a row that differs by more than case and spacing is no overlap."""
    (tmp_path / "train.csv").write_text("word,answer\nkilo,olik\n")
    (tmp_path / "val.csv").write_text('word,answer\nalpha,ahpla\n"br\navo",x\n"  BRAVO",ovarb\n')
    (tmp_path / "test.csv").write_text("word,answer\ncharlie,eilrahc\nbravo,ovarb\n")
    files = {s: tmp_path / f"{n}.csv" for s, n in (("train", "train"), ("validation", "val"), ("test", "test"))}
    with pytest.raises(TaskError) as e:
        Splits(task(prompt="reverse {word}: ", target="answer"), files)
    assert e.value.field == "task.files.validation"
    assert f"{files['validation']} line 5 has the same prompt as {files['test']} line 3" in str(e.value)
    assert "case and whitespace ignored; 1 of 3 validation rows are in the test file" in str(e.value)
    (tmp_path / "val.csv").write_text('word,answer\nalpha,ahpla\n"br\navo",x\n')  # `br avo` is not `bravo`
    assert len(Splits(task(prompt="reverse {word}: ", target="answer"), files).validation) == 2
