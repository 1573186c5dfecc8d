"""Every command-line mistake is one ``error:`` line with exit status 2. Found by trying them: an argument without
``=`` (``trainer.total_training_steps``) and an override Hydra cannot apply (``~trainer.total_training_steps``)
ended with Hydra's own multi-line report and exit status 1."""
import os
import subprocess
import sys

import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli
from trainer.overrides import prepare_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("args,needle", [
    (["trainer.total_training_steps"], "'trainer.total_training_steps' is not an override: expected key=value"),
    (["algorithm=gae", "critic"], "'critic' is not an override"),
    (["~trainer.total_training_steps"], "could not apply the overrides"),
])
def test_a_command_line_mistake_is_one_error(args, needle):
    errors = prepare_overrides(args).errors
    assert len(errors) == 1 and needle in errors[0], errors


@pytest.mark.parametrize("args", [["--cfg", "job"], ["-cn", "ppo_trainer", "trainer.total_training_steps=1"],
                                  ["~trainer.logger"], ["+trainer.total_training_steps=1"]])
def test_hydra_flags_and_valid_overrides_pass(args):
    assert prepare_overrides(args).errors == []


def test_cli_argument_without_equals_is_one_line(tmp_path):
    assert_one_line_error(run_cli(str(tmp_path / "out"), "trainer.total_training_steps", forked=True),
                          "'trainer.total_training_steps' is not an override")


def test_cli_print_config_still_works(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "trainer", "main.py"), "--cfg", "job",
                           f"trainer.output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "total_training_steps" in proc.stdout, proc.stderr[-2000:]
