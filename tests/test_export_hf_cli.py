"""tools/export_hf.py on verl's model-merger command line: ``merge --backend deepspeed|megatron --local_dir ...
--target_dir ...`` (issue #26); ``--backend`` must match the checkpoint in the folder."""
import pytest

from tools.export_hf import parse_args


def test_verl_merger_spelling_is_accepted(tmp_path):
    args = parse_args(["merge", "--backend", "deepspeed", "--local_dir", str(tmp_path), "--target_dir", "out"])
    assert (args.operation, args.backend, args.local_dir, args.target_dir) == ("merge", "deepspeed", str(tmp_path),
                                                                              "out")
    args = parse_args(["--local_dir", str(tmp_path), "--target_dir", "out"])  # this tool's own form
    assert args.operation is None and args.backend is None


def test_backend_must_match_the_checkpoint(tmp_path, capsys):
    (tmp_path / "meta.pt").write_bytes(b"")  # a Megatron role folder
    parse_args(["merge", "--backend", "megatron", "--local_dir", str(tmp_path), "--target_dir", "out"])
    with pytest.raises(SystemExit):
        parse_args(["merge", "--backend", "deepspeed", "--local_dir", str(tmp_path), "--target_dir", "out"])
    assert "holds a megatron checkpoint (meta.pt); use --backend megatron" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # verl's FSDP backend: this framework saves DeepSpeed or Megatron checkpoints
        parse_args(["merge", "--backend", "fsdp", "--local_dir", str(tmp_path), "--target_dir", "out"])


@pytest.mark.parametrize("sub,needle", [("nope/global_step_3/actor", "does not exist"),
                                        ("global_step_3", "is a step folder")])
def test_a_folder_without_a_checkpoint_is_one_error_line(tmp_path, capsys, sub, needle):
    from tools.export_hf import main

    (tmp_path / "global_step_3" / "actor").mkdir(parents=True)
    with pytest.raises(SystemExit) as info:
        main(["--local_dir", str(tmp_path / sub), "--target_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
