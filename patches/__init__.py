"""Packing and Ulysses sequence parallelism for Hugging Face models (patches/README.md).

The public API, importable from here::

    build_dp_sp_groups, UlyssesGroup, DpSpMesh   the SP process groups (patches.sequence_parallel)
    apply_ulysses_patch, validate_ulysses_config the attention patch (patches.ulysses)
    pack_batch, sp_forward, PackedBatch          the packed forward: pack, run, gather (patches.packed_forward)
    patch_info, mark_layers_compiled, set_static_shapes   compile / CUDA-graph settings (patches.patch_info)

Names with a leading underscore in any module of this package are private to it.
"""
from patches.packed_forward import PackedBatch, check_batch, pack_batch, resolve_sp_group, sp_forward
from patches.patch_info import UlyssesPatchInfo, mark_layers_compiled, patch_info, set_static_shapes
from patches.sequence_parallel import (DpSpMesh, UlyssesGroup, build_dp_sp_groups, current_ulysses_group,
                                       gather_outputs_and_unpad, validate_ulysses_config)
from patches.ulysses import ULYSSES_ATTN_IMPL, apply_ulysses_patch, ulysses_patched

__all__ = [
    "PackedBatch", "check_batch", "pack_batch", "resolve_sp_group", "sp_forward",
    "UlyssesPatchInfo", "mark_layers_compiled", "patch_info", "set_static_shapes",
    "DpSpMesh", "UlyssesGroup", "build_dp_sp_groups", "current_ulysses_group", "gather_outputs_and_unpad",
    "validate_ulysses_config", "ULYSSES_ATTN_IMPL", "apply_ulysses_patch", "ulysses_patched",
]
