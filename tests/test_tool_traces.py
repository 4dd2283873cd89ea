"""SFT on tool-use traces (issue 18): a written conversation (assistant call, tool message, final
answer) becomes exactly the ids and loss mask a multi-turn rollout holds; the schema, the
tools-arith preprocessor and the SFT stage carry such rows end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import assert_user_error, run_cli
from tool_helpers import TRACES
from tool_helpers import trace_ids as reference_trace_ids

CALL = TRACES["What is 12*34?"][0]


def _tok(tool_model):
    from alignctl.models.loading import load_tokenizer

    return load_tokenizer(tool_model["model"], padding_side="left")


def test_trace_ids_equal_the_rollout_layout(tool_model):
    """Independent reference: tests/tool_helpers.py builds the same traces by running the calculator
    through run_tool and the template's tool-turn ids, and the greedy rollout of the model fitted to
    them reproduces those ids (test_tools.py); the library's trace_ids, given the conversation as
    messages, must give the same prompt, response and loss mask, and equal the rollout here too."""
    from alignctl.rollout.engine import SamplingParams
    from alignctl.tools import tool_schemas
    from alignctl.tools.traces import trace_ids
    from test_tools import _rollout

    tok = _tok(tool_model)
    stop = int(tok.eos_token_id)
    conversations = {
        "What is 12*34?": [{"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"},
                           {"role": "assistant", "content": "#### 408"}],
        "What is 7+8?": [{"role": "assistant", "content": "#### 15"}],
    }
    _, _, rollout, prompts = _rollout(tool_model)
    out = rollout.generate(prompts, SamplingParams(n=1, greedy=True, max_new_tokens=256))
    for question, completion in conversations.items():
        got = trace_ids(tok, [{"role": "user", "content": question}], completion, tool_schemas(["calculator"]), stop)
        prompt, response, loss = reference_trace_ids(tok, question, (stop,))
        assert (got.prompt, got.response, got.loss_mask) == (prompt, response, loss), question
        row = list(TRACES).index(question)
        assert got.prompt == prompts[row] and got.response == out.responses()[row]
        assert out.loss_mask[row, :len(loss)].tolist() == got.loss_mask
    text = tok.decode([t for t, m in zip(got.response, got.loss_mask) if m])
    assert text == "#### 15<|end|>"


@pytest.mark.parametrize(("completion", "why"), [
    ([{"role": "tool", "content": "1"}, {"role": "assistant", "content": "#### 1"}], "starts and ends"),
    ([{"role": "assistant", "content": CALL}, {"role": "assistant", "content": "#### 408"}], "0 tool message"),
    ([{"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"}, {"role": "tool", "content": "9"},
      {"role": "assistant", "content": "#### 408"}], "1 tool call(s) but 2"),
    ([{"role": "assistant", "content": "#### 1"}, {"role": "tool", "content": "1"},
      {"role": "assistant", "content": "#### 1"}], "without a <tool_call> must be the last"),
    ([{"role": "assistant", "content": "<tool_call>{oops</tool_call>"}, {"role": "tool", "content": "1"},
      {"role": "assistant", "content": "#### 1"}], "malformed JSON"),
])
def test_malformed_traces_are_refused_by_the_schema(completion, why):
    from alignctl.data.schema import SchemaError, check_row

    row = {"data_source": "arith", "prompt": [{"role": "user", "content": "q"}], "completion": completion,
           "extra_info": {"split": "train", "index": 0}}
    with pytest.raises(SchemaError, match="tool-use trace") as info:
        check_row("sft", row)
    assert why in str(info.value)
    # a tool message anywhere else is still refused
    with pytest.raises(SchemaError, match="role"):
        check_row("preference", {**row, "chosen": [{"role": "tool", "content": "x"}], "rejected": completion[-1:]})


def test_tools_arith_files_and_sft_on_its_traces(tool_model, tmp_path: Path):
    """preprocess tools-arith -> sft with data.tools: TRL trains on input ids whose labels are the
    traces' model-written tokens only (the prompt and the inserted tool turn are -100)."""
    from alignctl.config import load_config
    from alignctl.config.sft import SFTConfig
    from alignctl.tools.calculator import calculator
    from alignctl.trainers.sft_trainer import build_sft_trainer, load_sft_split

    data = tmp_path / "data"
    result = run_cli("preprocess", "tools-arith", "--out", str(data), "tools_arith.num_train=6", "tools_arith.num_test=4",
                     "tools_arith.num_sft=5", "tools_arith.sft_digits=2")
    assert result.code == 0, result.stderr
    assert json.loads((data / "meta.json").read_text())["files"] == {"train.parquet": 6, "test.parquet": 4,
                                                                    "sft_train.parquet": 5}
    train, test, sft = (pd.read_parquet(data / f) for f in ("train.parquet", "test.parquet", "sft_train.parquet"))
    questions = [p[0]["content"] for p in train["prompt"]] + [p[0]["content"] for p in test["prompt"]]
    assert len(set(questions)) == 10 and all(len(q.split()[2]) == 3 for q in questions)  # 3-digit operands
    first = list(sft["completion"][0])
    a, b = (int(x) for x in sft["extra_info"][0]["question"].split(" * "))
    assert 10 <= a <= 99 and first[1] == {"role": "tool", "content": calculator(expression=f"{a} * {b}")}
    assert first[2]["content"] == f"#### {a * b}"

    cfg = load_config(SFTConfig, None, [f"model.path={tool_model['model']}", f"data.train_files=[{data / 'sft_train.parquet'}]",
                                        "data.tools=[calculator]", "data.max_length=1024", "trainer.max_steps=1",
                                        f"output_dir={tmp_path / 'sft'}"])
    tok = _tok(tool_model)
    rows = load_sft_split(cfg.data.train_files, "data.train_files", cfg, tok)
    trainer = build_sft_trainer(cfg, tok, rows, None, progress=False)
    example = trainer.train_dataset[0]
    kept = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
    assert tok.decode(kept) == f"{first[0]['content']}<|end|>#### {a * b}<|end|>"
    assert example["labels"] == [t if m else -100 for t, m in zip(rows[0]["input_ids"], rows[0]["completion_mask"])]


def test_traces_without_data_tools_get_a_one_line_error(tool_model, tmp_path: Path):
    data = tmp_path / "data"
    assert run_cli("preprocess", "tools-arith", "--out", str(data), "tools_arith.num_train=2", "tools_arith.num_test=2",
                   "tools_arith.num_sft=2").code == 0
    args = ["sft", f"model.path={tool_model['model']}", f"data.train_files=[{data / 'sft_train.parquet'}]",
            "trainer.max_steps=1", f"output_dir={tmp_path / 'sft'}"]
    assert_user_error(run_cli(*args), "sft_train.parquet", "tool-use traces", "data.tools")
    assert_user_error(run_cli(*args, "data.tools=[abacus]"), "data.tools", "abacus")
    assert not (tmp_path / "sft").exists()


def test_a_users_malformed_trace_names_the_file_and_row(tool_model, tmp_path: Path):
    """A user's own SFT file (not written by preprocess, so never schema-checked): the trace that
    answers one call with two tool messages is refused with its file and row, exit 2, no output."""
    rows = [{"prompt": [{"role": "user", "content": "What is 12*34?"}],
             "completion": [{"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"},
                            {"role": "assistant", "content": "#### 408"}]},
            {"prompt": [{"role": "user", "content": "What is 12*34?"}],
             "completion": [{"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"},
                            {"role": "tool", "content": "409"}, {"role": "assistant", "content": "#### 408"}]}]
    source = tmp_path / "traces.parquet"
    pd.DataFrame(rows).to_parquet(source)
    result = run_cli("sft", f"model.path={tool_model['model']}", f"data.train_files=[{source}]", "data.tools=[calculator]",
                     "trainer.max_steps=1", f"output_dir={tmp_path / 'sft'}")
    assert_user_error(result, str(source), "row 1", "1 tool call(s) but 2 tool message(s)")
    assert not (tmp_path / "sft").exists()
