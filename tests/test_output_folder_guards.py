"""What a run keeps of an output folder: a run that would write no model is warned at start, a second run into a
folder a live run holds is refused, ``trainer.val_only`` keeps the training run's ``final_metrics.json`` and a resume
from an older checkpoint sets the later timeline aside."""
import logging

import pytest

from tests.e2e_utils import resolved_config
from trainer.run_folder import nothing_saved_warnings


def test_e01_a_run_that_writes_no_model_is_warned_at_start(caplog):
    with caplog.at_level(logging.WARNING):
        resolved_config("trainer.export_hf_on_end=false", "trainer.total_training_steps=2")
    lines = [r.getMessage() for r in caplog.records if "written nowhere" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("trainer.export_hf_on_end=false with trainer.save_freq=-1")


@pytest.mark.parametrize("trainer", [{"export_hf_on_end": True, "save_freq": -1},
                                     {"export_hf_on_end": False, "save_freq": 5},
                                     {"export_hf_on_end": False, "save_freq": -1, "export_hf_freq_s": 60},
                                     {"export_hf_on_end": False, "save_freq": 0, "val_only": True}])
def test_a_run_that_writes_a_model_or_trains_nothing_is_not_warned(trainer):
    assert nothing_saved_warnings(trainer) == []
    assert len(nothing_saved_warnings({**trainer, "export_hf_on_end": False, "save_freq": 0, "export_hf_freq_s": -1,
                                       "val_only": False})) == 1
