"""Bad inputs a hostile or careless user gives the ``lit-grpo`` command (issue 17): each exits with code 2 and one
message naming the input and what to do, without a traceback, and, where the input can be checked that early,
before any model weights load. The table of what was tried and what happened is written by
``test_the_reliability_table_is_what_the_tests_saw`` into docs/reliability.md (``LIT_GRPO_WRITE_DOCS=1``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from reliability_doc import spliced
from safetensors.torch import load_file, save_file
from support import weight_reads

from lit_grpo.cli import main
from lit_grpo.policy.model_loading import load_policy

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
SMALL = ["--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
         "--data.max_new_tokens", "3", "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1"]


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # the input, as the table shows it
    prepare: Callable[[Path, Path], list[str]]  # (tmp dir, tiny model) -> CLI arguments
    message: str  # expected in the one line lit-grpo prints (<tmp> stands for the tmp dir)
    before_load: bool = True  # refused before any weights load


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def config(text: str) -> Callable[[Path, Path], list[str]]:
    return lambda tmp, model: ["--config", str(write(tmp / "run.yaml", text))]


def model_copy(tmp: Path, model: Path, change: Callable[[Path], None]) -> list[str]:
    target = tmp / "model"
    shutil.copytree(model, target)
    change(target)
    return ["--model.model_name_or_path", str(target)]


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100_000])


def set_model_type(directory: Path) -> None:
    settings = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**settings, "model_type": "zorblax"}))


def adapter(tmp: Path, model: Path, rank: int, targets: str | list[str], poison: bool = False) -> list[str]:
    torch.manual_seed(0)
    load_policy(str(model), rank, 2 * rank, 0.0, targets).save_pretrained(str(tmp / "adapter"))
    if poison:
        weights = load_file(tmp / "adapter" / "adapter_model.safetensors")
        first = sorted(weights)[0]
        weights[first][0, 0] = float("nan")
        save_file(weights, tmp / "adapter" / "adapter_model.safetensors")
    return ["--model.init_adapter", str(tmp / "adapter")]


def dataset_file(name: str, content: bytes | Callable[[Path], None]) -> Callable[[Path, Path], list[str]]:
    """A ``DatasetTask`` reading ``name`` in the tmp dir, written with ``content`` (or by it)."""
    def prepare(tmp: Path, model: Path) -> list[str]:
        target = tmp / name
        if callable(content):
            content(target)
        else:
            target.write_bytes(content)
        return ["--data.task", "lit_grpo.tasks.DatasetTask", "--data.task.path", str(target)]
    return prepare


def truncated_arrow(target: Path) -> None:
    """The first half of a real Arrow file as ``datasets`` writes it (its opening marker intact)."""
    import datasets

    saved = target.parent / "saved"
    datasets.Dataset.from_dict({"prompt": [f"{i}+1=" for i in range(50)],
                                "answer": [str(i + 1) for i in range(50)]}).save_to_disk(str(saved))
    whole = next(saved.glob("*.arrow")).read_bytes()
    target.write_bytes(whole[: len(whole) // 2])


def damaged_saved_dataset(target: Path) -> None:
    """A ``save_to_disk`` directory whose Arrow file keeps its header and offsets but whose string bytes are garbage
    (not UTF-8): ``datasets`` maps it unchecked, and the first row read fails."""
    import datasets

    datasets.Dataset.from_dict({"prompt": [f"{i}+1=" for i in range(50)],
                                "answer": [str(i + 1) for i in range(50)]}).save_to_disk(str(target))
    arrow = next(target.glob("*.arrow"))
    whole = bytearray(arrow.read_bytes())
    start = whole.find(b"0+1=")
    whole[start:start + 100] = b"\xff" * 100
    arrow.write_bytes(bytes(whole))


def sentiment_reward_model(tmp: Path, model: Path) -> list[str]:
    """A ``DatasetTask`` scored by a tiny random two-label (NEGATIVE/POSITIVE) classifier given without a label."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    target = tmp / "sentiment"
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(ROOT / "data" / "tiny-qwen2-chat" / name, target / name)
    config = Qwen2Config(vocab_size=32_704, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, id2label={0: "NEGATIVE", 1: "POSITIVE"},
                         label2id={"NEGATIVE": 0, "POSITIVE": 1},
                         pad_token_id=AutoTokenizer.from_pretrained(target).pad_token_id)
    Qwen2ForSequenceClassification(config).save_pretrained(target)
    reward = json.dumps([{"class_path": "lit_grpo.tasks.RewardModel", "init_args": {"path": str(target)}}])
    return ["--data.task", "lit_grpo.tasks.DatasetTask", "--data.task.path", "data/chat-addition/train.parquet",
            "--data.task.failure_reward", "-1", "--data.task.rewards", reward]


HELD_PORTS: list[socket.socket] = []  # listening until the test process ends, as another program's server would


@pytest.fixture(autouse=True, scope="module")
def close_held_ports():
    yield
    while HELD_PORTS:
        HELD_PORTS.pop().close()


def taken_port(server_args: bool) -> Callable[[Path, Path], list[str]]:
    """The vLLM server engine told to start its server on a port another process listens on."""
    def prepare(tmp: Path, model: Path) -> list[str]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        HELD_PORTS.append(listener)
        port = str(listener.getsockname()[1])
        given = ["--data.engine.init_args.server_args", f"[--port, '{port}']"] if server_args else [
            "--data.engine.init_args.port", port]
        return ["--data.engine", "lit_grpo.engines.VLLMServerEngine", *given]
    return prepare


def no_files(target: Path) -> None:
    target.mkdir()


CASES = [
    Case("yaml-syntax", "a config file that is not YAML", config("model: [1\n"),
         "--config '<tmp>/run.yaml' cannot be read as YAML: line 2, column 1: expected ',' or ']'"),
    Case("yaml-list", "a config file holding a list", config("- 1\n- 2\n"),
         "--config '<tmp>/run.yaml' holds a list, not a mapping of sections"),
    Case("yaml-scalar", "a config file holding a number", config("5\n"),
         "--config '<tmp>/run.yaml' holds a number, not a mapping of sections"),
    Case("yaml-section", "`model: 5`", config("model: 5\n"), "model: expected a mapping of model.* settings, got 5"),
    Case("yaml-empty", "an empty config file", config(""), "--config '<tmp>/run.yaml' is empty"),
    Case("yaml-duplicate", "a key set twice in one config file", config("model:\n  kl:\n    coef: 0.1\n    coef: 0.2\n"),
         "--config '<tmp>/run.yaml' sets model.kl.coef (line 4) twice; keep one"),
    Case("config-missing", "a config path that does not exist", lambda tmp, m: ["--config", str(tmp / "nope.yaml")],
         "--config '<tmp>/nope.yaml': no such file; give a YAML file"),
    Case("config-directory", "a directory given as the config", lambda tmp, m: ["--config", str(tmp)],
         "--config '<tmp>': a directory; give a YAML file"),
    Case("lr-negative", "`lr: -1`", lambda tmp, m: ["--model.optimizer", "AdamW", "--model.optimizer.lr", "-1"],
         "model.optimizer.lr: must be > 0, got -1"),
    Case("lr-zero", "`lr: 0`", lambda tmp, m: ["--model.optimizer", "AdamW", "--model.optimizer.lr", "0"],
         "model.optimizer.lr: must be > 0, got 0"),
    Case("lr-no-class", "an optimizer argument without its class", lambda tmp, m: ["--model.optimizer.lr", "1e-4"],
         "model.optimizer: name the optimizer class too"),
    Case("optimizer-own-check", "`SGD` with `momentum: -3`",
         lambda tmp, m: ["--model.optimizer", "SGD", "--model.optimizer.lr", "0.1", "--model.optimizer.momentum", "-3"],
         "model.optimizer: SGD(lr=0.1, momentum=-3.0): Invalid momentum value: -3.0"),
    Case("max-epochs", "`max_epochs: -5`", lambda tmp, m: ["--trainer.max_epochs", "-5"],
         "trainer.max_epochs: must be >= 0 (or -1 for no limit), got -5"),
    Case("lora-alpha", "`lora.alpha: -5`", lambda tmp, m: ["--model.lora.alpha", "-5"],
         "model.lora.alpha: must be > 0 (the adapter's scale is alpha / rank), got -5"),
    Case("task-low-high", "`ArithmeticTask` with `low > high`",
         lambda tmp, m: ["--data.task", "lit_grpo.tasks.ArithmeticTask", "--data.task.low", "50", "--data.task.high", "10"],
         "lit-grpo: ArithmeticTask: low (50) must not exceed high (10)"),
    Case("user-reward-refuses", "a user's own reward refusing its arguments with a plain `ValueError`",
         lambda tmp, m: ["--data.task", "lit_grpo.tasks.DatasetTask", "--data.task.path",
                         "data/chat-addition/train.parquet", "--data.task.rewards",
                         '[{"class_path": "tests.helpers_rewards.StrictReward", "init_args": {"scale": -1}}]'],
         "lit-grpo: tests.helpers_rewards.StrictReward refused its arguments: scale must be positive, got -1.0"),
    Case("model-no-tokenizer", "a model directory without tokenizer files",
         lambda tmp, m: model_copy(tmp, m, lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")]),
         "model.model_name_or_path: '<tmp>/model' holds no tokenizer"),
    Case("model-truncated", "a truncated model.safetensors",
         lambda tmp, m: model_copy(tmp, m, lambda d: truncate(d / "model.safetensors")),
         "'<tmp>/model/model.safetensors' cannot be read"),
    Case("model-bad-config", "a config.json that is not JSON",
         lambda tmp, m: model_copy(tmp, m, lambda d: write(d / "config.json", '{"model_type": ')),
         "'<tmp>/model': config.json is not valid JSON"),
    Case("model-unknown-type", "an unknown model_type",
         lambda tmp, m: model_copy(tmp, m, set_model_type),
         "config.json's model_type 'zorblax' is unknown to transformers"),
    Case("adapter-rank", "an init_adapter of another rank", lambda tmp, m: adapter(tmp, m, 4, "all-linear"),
         "model.init_adapter: '<tmp>/adapter' has rank 4, model.lora.rank is 16; set model.lora.rank 4"),
    Case("adapter-targets", "an init_adapter on other modules",
         lambda tmp, m: adapter(tmp, m, 16, ["q_proj"]) + ["--model.lora.target_modules", "[q_proj, v_proj]"],
         "model.init_adapter: '<tmp>/adapter' adapts ['q_proj'], model.lora.target_modules is ['q_proj', 'v_proj']"),
    Case("adapter-targets-all-linear", "an init_adapter on fewer modules than all-linear",
         lambda tmp, m: adapter(tmp, m, 16, ["q_proj"]),
         "init_adapter '<tmp>/adapter' adapts ['q_proj'], model.lora.target_modules asks for", before_load=False),
    Case("adapter-nan", "an init_adapter holding NaN", lambda tmp, m: adapter(tmp, m, 16, "all-linear", poison=True),
         "init_adapter '<tmp>/adapter' holds non-finite weights (1 tensors", before_load=False),
    Case("ckpt-empty", "an empty --ckpt_path file", lambda tmp, m: ["--ckpt_path", str(write(tmp / "x.ckpt", ""))],
         "ckpt_path: '<tmp>/x.ckpt' is not a readable checkpoint"),
    Case("ckpt-random", "a --ckpt_path file of random bytes",
         lambda tmp, m: ["--ckpt_path", str(write(tmp / "x.ckpt", "PK\x03\x04 not really a zip"))],
         "ckpt_path: '<tmp>/x.ckpt' is not a readable checkpoint"),
    Case("ckpt-last-none", "`--ckpt_path last` with nothing to resume", lambda tmp, m: ["--ckpt_path", "last"],
         "ckpt_path: 'last' found no last.ckpt in <tmp>/runs/checkpoints"),
    Case("jsonl-one-prompt", "a JSONL task file with one distinct prompt",
         lambda tmp, m: ["--data.task", "lit_grpo.tasks.JsonlTask",
                         "--data.task.path", str(write(tmp / "p.jsonl", '{"prompt": "a"}\n{"prompt": "a"}\n'))],
         "data file '<tmp>/p.jsonl' has 1 distinct prompt(s): too few to hold 1 out", before_load=False),
    Case("jsonl-null-prompt", "a JSONL record with `\"prompt\": null`",
         lambda tmp, m: ["--data.task", "lit_grpo.tasks.JsonlTask",
                         "--data.task.path", str(write(tmp / "p.jsonl", '{"prompt": "a"}\n{"prompt": null}\n'))],
         "<tmp>/p.jsonl:2: 'prompt' must be a non-empty string or a list of chat messages, got None",
         before_load=False),
    Case("dataset-no-column", "a Parquet dataset without the configured prompt column",
         lambda tmp, m: ["--data.task", "lit_grpo.tasks.DatasetTask", "--data.task.path",
                         "data/chat-addition/train.parquet", "--data.task.prompt_column", "question"],
         "row 0: no 'question' column (it has: prompt, solution, task_id); set data.task.init_args.prompt_column",
         before_load=False),
    Case("reward-model-two-labels", "a NEGATIVE/POSITIVE classifier given as a RewardModel without a label",
         sentiment_reward_model,
         "RewardModel '<tmp>/sentiment': its classifier head has 2 outputs (0 NEGATIVE, 1 POSITIVE) and the score is "
         "one of them: name it with label (e.g. label: POSITIVE) or label_index in the RewardModel's init_args"),
    Case("engine-key", "a misspelt key inside `data.engine.init_args`",
         lambda tmp, m: ["--data.engine", "lit_grpo.engines.HFEngine", "--data.engine.init_args.batchsize", "3"],
         "\n  - data.engine.batchsize: unknown key; did you mean batch_size?\n"),
    Case("callback-key", "a misspelt key in a callback's section",
         config("trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n      init_args:\n"
                "        every_n_epoch: 2\nmetrics:\n  table_row: 3\n"),
         "has 2 problem(s):\n  - trainer.callbacks[0].every_n_epoch: unknown key; did you mean every_n_epochs?\n"
         "  - metrics.table_row: unknown key; did you mean table_rows?\n"),
    Case("reward-key", "a misspelt key of a reward inside `data.task.init_args.rewards`",
         lambda tmp, m: ["--data.task", "lit_grpo.tasks.DatasetTask", "--data.task.path",
                         "data/chat-addition/train.parquet", "--data.task.rewards",
                         '[{"class_path": "lit_grpo.tasks.RewardModel", "init_args": {"path": "x", "labl": 1}}]'],
         "\n  - data.task.rewards[0].labl: unknown key; did you mean label?\n"),
    Case("top-level-key", "a misspelt top-level section", config("modle:\n  lora:\n    rank: 4\n"),
         "\n  - modle: unknown top-level key; did you mean model?\n"),
    Case("vllm-port-taken", "a vLLM server port another process listens on", taken_port(server_args=False),
         "data.engine.init_args.port: port <port> on 127.0.0.1 cannot be used (Address already in use; another process "
         "may be listening there): give a free port, or leave it unset for one the engine picks"),
    Case("vllm-port-taken-args", "the same port given as `--port` in `server_args`", taken_port(server_args=True),
         "data.engine.init_args.server_args (--port): port <port> on 127.0.0.1 cannot be used (Address already in use"),
    Case("csv-header-only", "a CSV holding only its header", dataset_file("p.csv", b"prompt,answer\n"),
         "data file '<tmp>/p.csv' holds only its header row (prompt,answer): no rows of data below it"),
    Case("csv-latin-1", "a Latin-1 CSV", dataset_file("p.csv", "prompt,answer\ncafé 1+1=,2\n".encode("latin-1")),
         "data file '<tmp>/p.csv' is not UTF-8 text (byte 0xE9 at offset 17, line 2); it seems to be Latin-1 "
         "(ISO-8859-1): save it as UTF-8"),
    Case("jsonl-utf-16", "a UTF-16 JSONL file", dataset_file("p.jsonl", '{"prompt": "1+1="}\n'.encode("utf-16")),
         "data file '<tmp>/p.jsonl' is not UTF-8 text (byte 0xFF at offset 0, line 1); it seems to be UTF-16"),
    Case("csv-semicolons", "a CSV separated by semicolons", dataset_file("p.csv", b"prompt;answer\n1+1=;2\n2+2=;4\n"),
         "lit-grpo: <tmp>/p.csv [train] row 0: no 'prompt' column (it has: prompt;answer) (one column, its name "
         "holding semicolons: a CSV separated by semicolons? save it with commas); set data.task.init_args.prompt_column"),
    Case("arrow-damaged", "a truncated Arrow file", dataset_file("p.arrow", truncated_arrow),
         "data file '<tmp>/p.arrow' (split 'train') is a damaged Arrow file (truncated or corrupted; its reader "
         "says"),
    Case("arrow-saved-garbage", "a save_to_disk folder whose Arrow body is garbage (its header intact)",
         dataset_file("saved", damaged_saved_dataset),
         "data file '<tmp>/saved' (split 'train') is a save_to_disk directory whose Arrow data is damaged (truncated or "
         "corrupted; its reader says UnicodeDecodeError"),
    Case("arrow-not-arrow", "a CSV named .arrow", dataset_file("p.arrow", b"prompt,answer\n1+1=,2\n"),
         "data file '<tmp>/p.arrow' is not an Arrow file (it lacks the Arrow format's opening marker): it is "
         "damaged, or another format under the .arrow suffix; it starts as text ('prompt,a')"),
    Case("parquet-empty", "an empty Parquet file", dataset_file("p.parquet", b""),
         "data file '<tmp>/p.parquet' is empty (0 bytes)"),
    Case("parquet-truncated", "a truncated Parquet file",
         dataset_file("p.parquet", (ROOT / "data/chat-addition/train.parquet").read_bytes()[:3000]),
         "data file '<tmp>/p.parquet' is not a Parquet file (a Parquet file starts and ends with PAR1): it is "
         "truncated or damaged"),
    Case("json-empty-list", "a JSON file holding `[]`", dataset_file("p.json", b"[]\n"),
         "data file '<tmp>/p.json' holds an empty JSON list: no rows"),
    Case("json-bad-line", "a .json file of JSON lines with one broken line",
         dataset_file("p.json", b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", answer: "4"}\n'),
         "data file '<tmp>/p.json' (split 'train') is not valid JSON lines: line 2, column 20: Expecting property "
         "name enclosed in double quotes (data.task.path"),
    Case("data-folder-empty", "a folder without data files as the data path", dataset_file("rows", no_files),
         "data file '<tmp>/rows' holds no data files (.jsonl, .json, .parquet, .csv, .arrow)"),
    Case("reward-model-causal", "a causal LM given as a RewardModel",
         lambda tmp, m: ["--data.task", "lit_grpo.tasks.DatasetTask", "--data.task.path",
                         "data/chat-addition/train.parquet", "--data.task.failure_reward", "-1",
                         "--data.task.rewards", '[{"class_path": "lit_grpo.tasks.RewardModel", "init_args": '
                         '{"path": "data/tiny-qwen2-chat"}}]'],
         "RewardModel 'data/tiny-qwen2-chat' is not a sequence-classification checkpoint (its config.json names "
         "['Qwen2ForCausalLM']); its score head would be random"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_input_gets_one_message_and_exit_code_2(case, tiny_llama_dir, tmp_path, capsys, monkeypatch):
    code, err, _, refused_before_load = outcome(case, tmp_path, Path(tiny_llama_dir), capsys, monkeypatch)
    assert code == 2, err[-2000:]
    assert case.message in masked(err, tmp_path)
    assert "Traceback" not in err
    assert "Generating train split" not in err and "Failed to " not in err  # datasets' own bars and log lines
    if case.before_load:
        assert refused_before_load


def masked(err: str, tmp: Path) -> str:
    """``err`` with the tmp dir shown as <tmp> and a port the test picked as <port>: the same text on every run."""
    return re.sub(r"\bport \d+ on\b", "port <port> on", err.replace(str(tmp), "<tmp>"))


def outcome(case: Case, tmp: Path, model: Path, capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str, bool]:
    """Give ``lit-grpo fit`` the case's input (prepared under ``tmp``): ``(exit code, stderr, the lines lit-grpo
    printed with ``tmp`` shown as <tmp>, whether no weights had loaded)``."""
    args = case.prepare(tmp, model)
    capsys.readouterr()  # what preparing the input printed (an adapter built here loads the model)
    weights_read = weight_reads(monkeypatch)  # after preparing the input, which may load the model
    base = ["fit", "--model.model_name_or_path", str(model), "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp / "runs"), *SMALL]
    with pytest.raises(SystemExit) as info:
        main(base + args)
    err = capsys.readouterr().err
    shown = masked(err, tmp)
    lines = [line for line in shown.splitlines() if line.startswith("lit-grpo:") or line.startswith("  - ")]
    return info.value.code, err, " ".join(lines), not weights_read


def table(seen: dict[str, tuple[int, str, bool]]) -> str:
    rows = ["| input | exit code | message | before weights load |", "|---|---|---|---|"]
    for case in CASES:
        code, message, early = seen[case.name]
        escaped = message.replace("|", "\\|")
        rows.append(f"| {case.what} | {code} | {escaped} | {'yes' if early else 'no'} |")
    return "\n".join(rows)


@pytest.mark.slow
def test_the_reliability_table_is_what_the_tests_saw(tiny_llama_dir, tmp_path, capsys):
    # every case is run here again, each in its own directory and with its own patches: the table depends on no
    # other test having run (``-k`` this test alone checks the whole table)
    seen = {}
    for case in CASES:
        (tmp_path / case.name).mkdir()
        with pytest.MonkeyPatch.context() as patch:
            code, _, message, early = outcome(case, tmp_path / case.name, Path(tiny_llama_dir), capsys, patch)
        seen[case.name] = (code, message, early)
    text = DOC.read_text() if DOC.is_file() else ""
    start, end = "<!-- bad-inputs:start -->", "<!-- bad-inputs:end -->"
    generated = f"{start}\n{table(seen)}\n{end}"
    if os.environ.get("LIT_GRPO_WRITE_DOCS"):
        text = spliced(text, start, end, generated)
        DOC.write_text(text)
    assert generated in text, "docs/reliability.md is stale: rerun this module with LIT_GRPO_WRITE_DOCS=1"
