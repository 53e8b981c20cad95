"""Checks of a task's data rows, so that no row fails hours into a run or is trained on in a form it was not meant
for. The rows' own checks run when they load (at setup, before any model weights); the chat-template check needs the
tokenizer and runs once before any rollout (``lit_grpo.rollout.prompt_check.check_inputs`` calls
``check_rendering``). Each problem raises ``InputError`` naming the file and row (or the prompt) and what to change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord, Task, is_conversation, prompt_text

Located = tuple[str, PromptRecord]  # where the row is (``file:line`` or ``path [split] row N``), its record
TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


def conversation_problem(prompt: list[dict[str, Any]]) -> str | None:
    """Why a list of mappings is not a conversation the chat template can render: each message needs a ``role``
    string and a ``content`` string, and some content must not be blank."""
    for index, message in enumerate(prompt):
        role = message.get("role")
        if not isinstance(role, str) or not role.strip():
            return f"message {index} has role {role!r:.40}; give each message a role such as 'user'"
        content = message.get("content")
        if not isinstance(content, str):
            return (f"message {index} ({role}) has content {content!r:.40}; give each message's content as a string"
                    + (" ('' for a message without text)" if content is None else ""))
    if not any(message["content"].strip() for message in prompt):
        return "has only blank messages; give each row a prompt"
    return None


def prompt_problem(prompt: Any) -> str | None:
    """Why a prompt cannot be trained on: neither a non-blank string nor a conversation that renders."""
    if isinstance(prompt, str) and prompt.strip():
        return None
    if isinstance(prompt, list) and prompt and all(isinstance(message, dict) for message in prompt):
        return conversation_problem(prompt)
    return f"must be a non-empty string or a list of chat messages, got {prompt!r:.80}"


def answer_problem(answer: Any, compared: bool) -> str | None:
    """Why a reference answer cannot be ``compared`` as text by the exact-match reward: it must be a string or an
    integer (``None``: missing; see ``check_rows``). With other rewards the answer is only the reference of the
    ``accuracy`` metric, and any value is kept as it is."""
    if not compared or answer is None or isinstance(answer, str):
        return None
    if isinstance(answer, int) and not isinstance(answer, bool):
        return None
    return (f"is {type(answer).__name__} {answer!r:.40}: exact match compares text, and {str(answer)!r:.40} is not "
            "what a completion says; store the answers as strings")


def separator_hint(row: dict[str, Any]) -> str:
    """A row of one column whose name holds ``;``, a tab or ``|``: a CSV separated by that, read as commas."""
    names = {";": "semicolons", "\t": "tabs", "|": "bars"}
    found = [name for sep, name in names.items() if len(row) == 1 and sep in str(next(iter(row)))]
    return f" (one column, its name holding {found[0]}: a CSV separated by {found[0]}? save it with commas)" if found \
        else ""


def checked_record(where: str, row: dict[str, Any], prompt_column: str, answer_column: str,
                   compared: bool) -> PromptRecord:
    """The row as a prompt record (every column kept; ``prompt`` and ``answer`` from the mapped columns), or
    ``InputError`` naming the row when its prompt or answer cannot be used."""
    if prompt_column not in row:
        raise InputError(f"{where}: no {prompt_column!r} column (it has: {', '.join(map(str, row))})"
                         f"{separator_hint(row)}; set data.task.init_args.prompt_column")
    prompt = row[prompt_column]
    problem = prompt_problem(prompt)
    if problem:
        raise InputError(f"{where}: {prompt_column!r} {problem}")
    answer = row.get(answer_column)
    problem = answer_problem(answer, compared)
    if problem:
        raise InputError(f"{where}: the answer ({answer_column!r}) {problem} (or set "
                         "data.task.init_args.answer_column to the column of reference answers)")
    return {**row, "prompt": prompt, "answer": "" if answer is None else answer}


def check_rows(rows: Sequence[Located], answers_compared: bool, trl_functions: bool,
               answerless: Sequence[str] = ()) -> None:
    """What no single row shows: prompts given in two forms (strings and conversations: trained and rewarded in
    two forms); where the exact-match reward is trained on, rows without an answer among rows with one
    (``answerless``: where they are) and one prompt with two different answers (it would be rewarded for both and
    for neither); a column named like an argument TRL-style functions receive."""
    forms: dict[bool, str] = {}
    for where, record in rows:
        forms.setdefault(is_conversation(record["prompt"]), where)
    if len(forms) == 2:
        raise InputError(f"{forms[True]} holds a conversation (a list of chat messages) and {forms[False]} a string: "
                         "give every prompt in one form (with data.task.init_args.use_chat_template a string is "
                         "rendered as one user turn)")
    if answers_compared and 0 < len(answerless) < len(rows):
        raise InputError(f"{answerless[0]}: no answer, while other rows have one; exact match would score this "
                         "prompt's completions as if the answer were empty: give every row an answer")
    if answers_compared:
        seen: dict[str, Located] = {}
        for where, record in rows:
            key = repr(record["prompt"])
            first = seen.setdefault(key, (where, record))
            if str(first[1]["answer"]).strip() != str(record["answer"]).strip():
                raise InputError(f"{first[0]} and {where} give the prompt {prompt_text(record)!r:.60} two answers "
                                 f"({first[1]['answer']!r:.30} and {record['answer']!r:.30}); exact match would "
                                 "reward neither consistently: keep one")
    if trl_functions:
        for where, record in rows:
            shadowed = [name for name in TRL_ARGUMENTS if name in record]
            if shadowed:
                raise InputError(f"{where}: column {shadowed[0]!r} has the name of an argument TRL-style reward "
                                 "functions receive (the column would be lost); rename it")


def check_rendering(task: Task, tokenizer: Any, model_name: str) -> None:
    """Render every distinct prompt of both splits once through the tokenizer's chat template, where it is used (a
    conversation, or ``use_chat_template``): a missing template, one that raises, or one that renders none of the
    prompt's text is named with the prompt, before any rollout. About 0.1 ms per prompt."""
    template = getattr(tokenizer, "chat_template", None) is not None
    for split, records in (("training", task.train_records()), ("held-out", task.heldout_records())):
        rendered: set[str] = set()
        for record in records:
            key = repr(record["prompt"])
            if key in rendered or not (is_conversation(record["prompt"]) or task.use_chat_template):
                continue
            if not template:
                raise InputError(missing_template(split, is_conversation(record["prompt"]), model_name))
            rendered.add(key)
            problem = rendering_problem(task, tokenizer, record)
            if problem:
                raise InputError(f"data.task: the chat template of {model_name!r} {problem} on the {split} prompt "
                                 f"{prompt_text(record)!r:.80}; fix the template (chat_template.jinja, or "
                                 "chat_template in tokenizer_config.json) or the prompt")


def missing_template(split: str, conversations: bool, model_name: str) -> str:
    """The message for prompts that need a chat template the tokenizer lacks."""
    if conversations:
        return (f"data.task: the {split} prompts are conversations (lists of chat messages) but the tokenizer of "
                f"{model_name!r} has no chat template; use a model whose tokenizer has one, or give the prompts as "
                "strings")
    return (f"data.task: use_chat_template is true but the tokenizer of {model_name!r} has no chat template; set "
            "data.task.init_args.use_chat_template false, or use a model whose tokenizer has one")


def rendering_problem(task: Task, tokenizer: Any, record: PromptRecord) -> str | None:
    """Why the chat template cannot render ``record``'s prompt: it raises, or renders none of the prompt's text."""
    try:
        text = task.chat_text(record, tokenizer)
    except Exception as error:  # noqa: BLE001 - a template's own failure (raise_exception, a missing key) is named
        return f"fails ({type(error).__name__}: {str(error)[:120]})"
    prompt = record["prompt"]
    messages = prompt if is_conversation(prompt) else [{"role": "user", "content": prompt}]
    contents = [m["content"].strip() for m in messages if m["content"].strip()]
    if not isinstance(text, str) or not any(content in text for content in contents):
        return f"renders none of the prompt's text ({text!r:.60})"
    return None
