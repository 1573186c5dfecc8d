"""Checkpoints: layout/tracker/retention/RNG helpers (base), which checkpoint a resume takes (resume), crash-safe writes (atomic), the DeepSpeed manager and the HF export."""

from trainer.checkpoint.base import (TRACKER_FILE, CheckpointManager, apply_retention, capture_rng_state,
                                     commit_checkpoint, find_latest_checkpoint, is_complete_checkpoint,
                                     list_checkpoints, load_trainer_state, parse_step, read_tracker,
                                     restore_rng_state, save_trainer_state, step_dir, write_tracker)
from trainer.checkpoint.resume import resolve_resume_path

__all__ = ["TRACKER_FILE", "CheckpointManager", "apply_retention", "capture_rng_state", "commit_checkpoint",
           "find_latest_checkpoint", "is_complete_checkpoint", "list_checkpoints", "load_trainer_state",
           "parse_step", "read_tracker", "resolve_resume_path", "restore_rng_state", "save_trainer_state",
           "step_dir", "write_tracker"]
