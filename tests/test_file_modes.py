"""Files the run writes get the mode the user's umask gives (``0o666 & ~umask``): checkpoint files came from
``tempfile.mkstemp`` and weights from safetensors, both 0600 whatever the umask, so a teammate or a serving process
of another user could read an exported model's config and tokenizer but not its weights."""
import os

import pytest
import torch


@pytest.fixture
def umask():
    def set_mask(mask):
        os.umask(mask)
        return 0o666 & ~mask
    old = os.umask(0o022)
    os.umask(old)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_checkpoint_files_and_exported_weights_follow_the_umask(tmp_path, umask, mask):
    from transformers import AutoModelForCausalLM

    from trainer import embedded
    from trainer.checkpoint.atomic import atomic_torch_save, atomic_write_text
    from trainer.checkpoint.hf_export import export_hf

    want = umask(mask)
    atomic_torch_save({"step": 1}, str(tmp_path / "data.pt"))
    atomic_write_text(str(tmp_path / "latest"), "global_step_1")
    torch.manual_seed(0)
    tok = embedded.build_tokenizer()
    model = AutoModelForCausalLM.from_config(embedded.tiny_model_config(len(tok)))
    out = str(tmp_path / "hf")
    export_hf(model, out, tokenizer=tok, dtype=torch.float32)
    files = [str(tmp_path / "data.pt"), str(tmp_path / "latest")] + \
        [os.path.join(d, n) for d, _, names in os.walk(out) for n in names]
    assert os.path.join(out, "model.safetensors") in files
    assert {f: oct(os.stat(f).st_mode & 0o777) for f in files} == {f: oct(want) for f in files}
