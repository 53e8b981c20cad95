"""Data rows, reward weights and chat templates that would corrupt a run (issue 34): each is refused by the
``lit-grpo`` command with exit code 2 and one message naming the file and row (or the prompt) and what to do, no
traceback; rows and weights before any model weights load, templates (which need the tokenizer) before any rollout.
Each case writes its row of docs/reliability.md (``LIT_GRPO_WRITE_DOCS=1``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from reliability_doc import documented
from support import weight_reads

from lit_grpo.cli import main
from lit_grpo.errors import InputError
from lit_grpo.tasks import DatasetTask

ROOT = Path(__file__).resolve().parents[1]
CHAT_MODEL = ROOT / "data" / "tiny-qwen2-chat"
SMALL = ["--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
         "--data.max_new_tokens", "3", "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1"]


def chat(text: str, system: str | None = None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def rows(tmp: Path, records: list[dict], name: str = "rows.jsonl") -> str:
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def plain(count: int = 8) -> list[dict]:
    return [{"prompt": f"{n}+1=", "answer": str(n + 1)} for n in range(10, 10 + count)]


def chats(count: int = 8) -> list[dict]:
    return [{"prompt": chat(f"{n}+1="), "answer": str(n + 1)} for n in range(10, 10 + count)]


def task_config(tmp: Path, **init_args: object) -> list[str]:
    config = {"data": {"task": {"class_path": "lit_grpo.tasks.DatasetTask",
                                "init_args": {"heldout_fraction": 0.25, **init_args}}}}
    (tmp / "run.yaml").write_text(yaml.safe_dump(config))  # NaN and inf as YAML writes them: .nan, .inf
    return ["--config", str(tmp / "run.yaml")]


def trl_file(tmp: Path) -> str:
    (tmp / "rewards.py").write_text("def ones(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    return f"{tmp}/rewards.py:ones"


def chat_model(tmp: Path, template: str | None) -> list[str]:
    """A copy of the chat model whose chat template is ``template`` (``None``: none)."""
    target = tmp / "model"
    shutil.copytree(CHAT_MODEL, target)
    if template is None:
        (target / "chat_template.jinja").unlink()
    else:
        (target / "chat_template.jinja").write_text(template)
    return ["--model.model_name_or_path", str(target), "--model.dtype", "float32"]


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # the input, as the table shows it
    prepare: Callable[[Path], list[str]]  # tmp dir -> CLI arguments
    message: str  # expected in what lit-grpo prints (<tmp> stands for the tmp dir)
    before_load: bool = True  # refused before any weights load; else before any rollout


def mixed(tmp: Path) -> list[str]:
    records = plain(4) + chats(4)[2:]
    return task_config(tmp, path=rows(tmp, records))


def mixed_splits(tmp: Path) -> list[str]:
    return task_config(tmp, path=rows(tmp, chats(6)), test_path=rows(tmp, plain(2)[:1] + [
        {"prompt": "99+1=", "answer": "100"}], "held.jsonl"))


CASES = [
    Case("content-none", "a chat message with `content: null`",
         lambda tmp: task_config(tmp, path=rows(tmp, chats(6) + [{"prompt": chat(None, "Be brief."), "answer": "1"}])),
         "<tmp>/rows.jsonl:7: 'prompt' message 1 (user) has content None; give each message's content as a string"),
    Case("role-missing", "a chat message without a role",
         lambda tmp: task_config(tmp, path=rows(tmp, chats(6) + [{"prompt": [{"content": "1+1="}], "answer": "2"}])),
         "<tmp>/rows.jsonl:7: 'prompt' message 0 has role None; give each message a role such as 'user'"),
    Case("blank-conversation", "a conversation whose messages are all blank",
         lambda tmp: task_config(tmp, path=rows(tmp, [{"prompt": chat(" "), "answer": "1"}] + chats(6))),
         "<tmp>/rows.jsonl:1: 'prompt' has only blank messages; give each row a prompt"),
    Case("empty-prompt", "a row with the prompt `\"\"`",
         lambda tmp: task_config(tmp, path=rows(tmp, plain(6) + [{"prompt": "", "answer": "1"}])),
         "<tmp>/rows.jsonl:7: 'prompt' must be a non-empty string or a list of chat messages, got ''"),
    Case("mixed-forms", "plain and chat rows in one file", mixed,
         "<tmp>/rows.jsonl:5 holds a conversation (a list of chat messages) and <tmp>/rows.jsonl:1 a string: give "
         "every prompt in one form"),
    Case("mixed-splits", "chat training rows and plain held-out rows (`test_path`)", mixed_splits,
         "<tmp>/rows.jsonl:1 holds a conversation (a list of chat messages) and <tmp>/held.jsonl:1 a string"),
    Case("two-answers", "one prompt with two different answers (exact match)",
         lambda tmp: task_config(tmp, path=rows(tmp, plain(6) + [{"prompt": "10+1=", "answer": "12"}])),
         "<tmp>/rows.jsonl:1 and <tmp>/rows.jsonl:7 give the prompt '10+1=' two answers ('11' and '12'); exact "
         "match would reward neither consistently: keep one"),
    Case("answer-float", "an answer column of floats (exact match)",
         lambda tmp: task_config(tmp, path=rows(tmp, [{"prompt": r["prompt"], "answer": float(r["answer"])}
                                                      for r in plain(6)])),
         "<tmp>/rows.jsonl:1: the answer ('answer') is float 11.0: exact match compares text, and '11.0' is not "
         "what a completion says; store the answers as strings"),
    Case("answer-missing-one", "one row without an answer among rows with one (exact match)",
         lambda tmp: task_config(tmp, path=rows(tmp, plain(6) + [{"prompt": "5+5="}])),
         "<tmp>/rows.jsonl:7: no answer, while other rows have one; exact match would score this prompt's "
         "completions as if the answer were empty: give every row an answer"),
    Case("answers-none", "no answer column at all (exact match)",
         lambda tmp: task_config(tmp, path=rows(tmp, [{"prompt": r["prompt"]} for r in plain(6)])),
         "data file '<tmp>/rows.jsonl': no row has an answer ('answer' column), and the default exact-match "
         "reward compares completions with it"),
    Case("trl-column", "a column named `completions` beside a TRL-style function",
         lambda tmp: task_config(tmp, path=rows(tmp, [{**r, "completions": "x"} for r in plain(6)]),
                                 rewards=[trl_file(tmp)], failure_reward=0.0),
         "<tmp>/rows.jsonl:1: column 'completions' has the name of an argument TRL-style reward functions receive "
         "(the column would be lost); rename it"),
    Case("weight-nan", "`reward_weights: [.nan]`",
         lambda tmp: task_config(tmp, path=rows(tmp, plain(6)), reward_weights=[float("nan")]),
         "data.task.init_args.reward_weights[0] is nan; each weight must be a finite number"),
    Case("weight-inf", "`reward_weights: [1.0, .inf]`",
         lambda tmp: task_config(tmp, path=rows(tmp, plain(6)), rewards=[trl_file(tmp), trl_file(tmp)],
                                 reward_weights=[1.0, float("inf")], failure_reward=0.0),
         "data.task.init_args.reward_weights[1] is inf; each weight must be a finite number"),
    Case("weights-zero", "`reward_weights: [0.0, 0.0]`",
         lambda tmp: task_config(tmp, path=rows(tmp, plain(6)), rewards=[trl_file(tmp), trl_file(tmp)],
                                 reward_weights=[0.0, 0.0], failure_reward=0.0),
         "data.task.init_args.reward_weights are all 0: every completion would score 0 and nothing would be learned"),
    Case("failure-nan", "`failure_reward: .nan`",
         lambda tmp: task_config(tmp, path=rows(tmp, plain(6)), failure_reward=float("nan")),
         "data.task.init_args.failure_reward is nan; give a finite number within ±1e+06"),
    Case("template-missing", "`use_chat_template: true` with a tokenizer without a chat template",
         lambda tmp: task_config(tmp, path=rows(tmp, plain(6)), use_chat_template=True) + chat_model(tmp, None),
         "data.task: use_chat_template is true but the tokenizer of '<tmp>/model' has no chat template; set "
         "data.task.init_args.use_chat_template false, or use a model whose tokenizer has one", before_load=False),
    Case("template-raises", "a chat template that raises on a system message",
         lambda tmp: task_config(tmp, path=rows(tmp, chats(5) + [{"prompt": chat("3+3=", "Be brief."), "answer": "6"}]))
         + chat_model(tmp, "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system "
                           "messages') }}{% endif %}{{ m.content }}{% endfor %}"),
         "data.task: the chat template of '<tmp>/model' fails (TemplateError: no system messages) on the training "
         "prompt 'system: Be brief. | user: 3+3='; fix the template",
         before_load=False),
    Case("template-empty", "a chat template that renders nothing",
         lambda tmp: task_config(tmp, path=rows(tmp, chats(6))) + chat_model(tmp, "{{ '' }}"),
         "data.task: the chat template of '<tmp>/model' renders none of the prompt's text ('') on the training prompt",
         before_load=False),
    Case("template-drops", "a chat template that drops the messages (renders only the generation prompt)",
         lambda tmp: task_config(tmp, path=rows(tmp, chats(6))) + chat_model(
             tmp, "{% for m in messages %}{% if m.role == 'human' %}{{ m.content }}{% endif %}{% endfor %}<|im_start|>"),
         "data.task: the chat template of '<tmp>/model' renders none of the prompt's text ('<|im_start|>')",
         before_load=False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_row_weight_or_template_is_refused_with_one_message(case, tiny_llama_dir, tmp_path, capsys,
                                                                  monkeypatch):
    from lit_grpo.engines.hf import HFEngine

    generated: list[int] = []
    monkeypatch.setattr(HFEngine, "generate", lambda self, prompts, *a, **k: generated.append(len(prompts)))
    args = case.prepare(tmp_path)
    reads = weight_reads(monkeypatch)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model.model_name_or_path", str(tiny_llama_dir), "--trainer.logger", "false",
              "--trainer.default_root_dir", str(tmp_path / "runs"), *SMALL, *args])
    err = capsys.readouterr().err
    shown = err.replace(str(tmp_path), "<tmp>")
    lines = [line for line in shown.splitlines() if line.startswith("lit-grpo:")]
    assert info.value.code == 2, err[-2000:]
    assert lines and case.message in lines[-1], shown[-2000:]  # the last line lit-grpo printed, and once
    assert sum(case.message[:30] in line for line in shown.splitlines()) == 1
    assert "Traceback" not in err and generated == []  # no rollout was drawn
    assert not reads if case.before_load else reads  # rows and weights: before any weights; templates: after
    when = "before any weights load" if case.before_load else "after the model loaded, before any rollout"
    documented(case.what, f"exit 2 {when}: {lines[-1]}", "test_data_rows.py", section="rows-and-rewards")


def test_the_same_row_twice_is_trained_as_often_as_it_appears_and_held_out_together(tmp_path):
    records = plain(8) + plain(8)[:2]  # rows 9 and 10 repeat rows 1 and 2
    task = DatasetTask(rows(tmp_path, records), heldout_fraction=0.25)
    train, heldout = task.train_records(), task.heldout_records()
    counts = {r["prompt"]: [r["prompt"] for r in [*train, *heldout]].count(r["prompt"]) for r in records}
    assert counts["10+1="] == counts["11+1="] == 2 and len(train) + len(heldout) == 10
    for prompt in ("10+1=", "11+1="):  # both copies on one side of the split
        assert [r["prompt"] for r in train].count(prompt) in (0, 2)
    documented("the same row twice", "accepted: trained as often as it appears; both copies on the same side of "
               "the held-out split (it holds out distinct prompts)", "test_data_rows.py", section="rows-and-rewards")


def test_rows_are_checked_at_setup_before_the_model_loads(tmp_path):
    task = DatasetTask(rows(tmp_path, chats(6) + [{"prompt": chat(None), "answer": "1"}]), heldout_fraction=0.25)
    with pytest.raises(InputError, match=r"rows.jsonl:7: 'prompt' message 0 \(user\) has content None"):
        task.use_device("cpu")  # what the data module calls at setup, before configure_model loads the weights


def test_a_list_answer_or_an_odd_prompt_is_kept_where_no_reward_compares_answers(tmp_path):
    records = [{"prompt": r["prompt"], "answer": [r["answer"], "eleven"]} for r in plain(6)]
    task = DatasetTask(rows(tmp_path, records), rewards=[trl_file(tmp_path)], failure_reward=0.0)
    assert all(isinstance(r["answer"], list) for r in task.train_records())  # only accuracy's reference
    with pytest.raises(InputError, match="rows.jsonl:1: the answer \\('answer'\\) is list"):
        DatasetTask(rows(tmp_path, records)).train_records()  # exact match would compare its repr


def test_a_saved_dataset_without_the_split_asked_for_names_the_splits_it_has(tmp_path):
    import datasets

    from lit_grpo.errors import InputError
    from lit_grpo.tasks.data_files import load_rows

    rows = datasets.Dataset.from_dict({"prompt": ["1+1="], "answer": ["2"]})
    datasets.DatasetDict({"train": rows, "validation": rows}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(InputError, match=r"holds the splits \['train', 'validation'\], not 'test'"):
        load_rows(str(tmp_path / "saved"), "test")
    assert [row for _, row in load_rows(str(tmp_path / "saved"), "validation")] == [{"prompt": "1+1=", "answer": "2"}]
