"""``actor_rollout_ref.model.custom_chat_template`` that is not a usable chat template stops the run before start-up
in one line naming the key. Found by trying it: a template's FILE NAME (the README points at
tools/chat_templates/smollm2_tool.jinja) was taken as the template's text, so every prompt rendered as that file name
without its conversation and the run trained on it without a word; a template with a syntax error stopped with a
jinja traceback; a template that fails while rendering a row raised from inside the dataset."""
import os
import re

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from tests.test_reliability_data import _jsonl, _row
from trainer.config.model import check_chat_template
from trainer.config_checks import ConfigError
from trainer.dataset import DataError, PromptDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "actor_rollout_ref.model.custom_chat_template"
GOOD = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.mark.parametrize("template,needle", [
    ("tools/chat_templates/smollm2_tool.jinja", "is a file name"),
    ("{% for m in messages %}{{ m.content", "not a valid Jinja template (line 1"),
    ("hello", "never reads `messages`"),
    ("   ", "expected the Jinja source"),
])
def test_an_unusable_template_is_refused(template, needle, monkeypatch):
    monkeypatch.chdir(ROOT)   # the file name is relative to where the run starts
    with pytest.raises(ConfigError, match=re.escape(needle)):
        check_chat_template(KEY, template)


@pytest.mark.parametrize("template", [GOOD, open(os.path.join(ROOT, "tools", "chat_templates",
                                                              "smollm2_tool.jinja")).read()])
def test_a_chat_template_passes(template):
    check_chat_template(KEY, template)


def test_cli_refuses_a_file_name_before_workers(tmp_path):
    proc = run_cli(str(tmp_path / "out"), f"{KEY}=tools/chat_templates/smollm2_tool.jinja", forked=True)
    assert_one_line_error(proc, KEY, "is a file name", "$(cat tools/chat_templates/smollm2_tool.jinja)")


def test_a_template_that_fails_while_rendering_is_a_data_error(tmp_path):
    from trainer import embedded

    broken = embedded.build_tokenizer()
    broken.chat_template = "{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}"
    with pytest.raises(DataError, match="chat template cannot render"):
        PromptDataset(_jsonl(tmp_path / "d.jsonl", [_row()]), broken, max_prompt_length=16)
