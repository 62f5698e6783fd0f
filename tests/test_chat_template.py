"""The checkpoint's own chat template for an instruct model (LongBench ``chat_template: tokenizer``, RULER
``model_template: tokenizer``); off by default, and one line for a base model that has none."""
from __future__ import annotations

import pytest

from harness.evals.templates import tokenizer_chat_template

TEMPLATE = "{{ bos_token }}{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}<|assistant|>"


@pytest.fixture
def chat_tok(tiny):
    from transformers import AutoTokenizer

    from harness.models.tiny_llama import ASSET_DIR

    tok = AutoTokenizer.from_pretrained(str(ASSET_DIR))
    tok.chat_template = TEMPLATE
    return tok


def test_the_template_wraps_one_user_turn_and_opens_the_answer(chat_tok):
    fmt = tokenizer_chat_template(chat_tok)
    assert fmt.format(prompt="Q {x}") == "<|user|>Q {x}<|end|><|assistant|>"  # BOS left to the tokenizer


def test_longbench_and_ruler_use_it_only_when_asked(chat_tok, tiny):
    from harness.evals import longbench as lb
    from harness.evals.ruler_data import RulerGenerator

    sample = {"context": "a b c", "input": "what?"}
    task = "narrativeqa"  # a task pred.py wraps in the chat template (not in NO_CHAT_TASKS)
    assert task not in lb.M.NO_CHAT_TASKS
    plain, _ = lb.build_input(chat_tok, task, sample, 4096)
    chat, _ = lb.build_input(chat_tok, task, sample, 4096, chat_template="tokenizer")
    text = chat_tok.decode(chat)
    assert "<|user|>" in text and text.rstrip().endswith("<|assistant|>") and "<|user|>" not in chat_tok.decode(plain)
    g = RulerGenerator(chat_tok, model_template="tokenizer")
    assert g.model_template.format(task_template="T") == "<|user|>T<|end|><|assistant|>"
    with pytest.raises(ValueError, match="no chat template"):
        RulerGenerator(tiny.tokenizer, model_template="tokenizer")  # the base model's tokenizer has none
