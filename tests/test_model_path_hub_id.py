"""A Hub id given as the model path (verl users pass ``Org/Name``): model paths are local folders here, so the
one-line error says how to download the model instead of only "does not exist"."""
import pytest

from trainer.config_checks import ConfigError
from trainer.config_preflight import _check_model_paths


def _cfg(path):
    return {"actor_rollout_ref": {"model": {"path": path}}, "critic": {"enable": False, "model": {}}}


def test_a_hub_id_as_model_path_says_how_to_download_it():
    with pytest.raises(ConfigError) as info:
        _check_model_paths(_cfg("HuggingFaceTB/SmolLM2-135M-Instruct"))
    msg = str(info.value)
    assert "\n" not in msg and "does not exist" in msg
    assert "huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir" in msg, msg


@pytest.mark.parametrize("path", ["/nonexistent/model", "./models/x", "a/b/c"])
def test_a_missing_local_path_is_not_taken_for_a_hub_id(path):
    with pytest.raises(ConfigError) as info:
        _check_model_paths(_cfg(path))
    assert "huggingface-cli" not in str(info.value)
