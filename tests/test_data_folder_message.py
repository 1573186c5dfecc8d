"""A folder named as a data file (``data.train_files`` / ``data.val_files``)."""
import pytest


def test_a_data_folder_is_named_as_a_folder_with_its_files(tmp_path):
    """A folder given as data.train_files was reported as a file that does not exist."""
    from trainer.config_preflight import _check_data_files
    from trainer.config_checks import ConfigError

    (tmp_path / "shards").mkdir()
    for n in ("part-1.parquet", "part-0.parquet", "notes.txt"):
        (tmp_path / "shards" / n).write_bytes(b"")
    (tmp_path / "empty").mkdir()
    cfg = {"data": {"train_files": str(tmp_path / "shards"), "val_files": [str(tmp_path / "empty")]},
           "trainer": {"test_freq": 5}}  # val_files are read (and checked) when validation runs
    with pytest.raises(ConfigError) as err:
        _check_data_files(cfg)
    text = str(err.value)
    shards = tmp_path / "shards"
    assert (f"data.train_files: {str(shards)!r} is a folder (expected a .parquet or .jsonl file); name its files as "
            f"a list: data.train_files=[{shards}/part-0.parquet,{shards}/part-1.parquet]") in text, text
    assert f"data.val_files: {str(tmp_path / 'empty')!r} is a folder" in text and "holds no .parquet" in text
