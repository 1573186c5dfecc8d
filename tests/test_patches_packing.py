"""Packing helpers (patches/packing.py) and SP pad/slice/gather helpers on one process."""
import pytest
import torch

from patches.packing import (cu_seqlens_from_position_ids, pack_loss_spans, pack_tensor, position_ids_from_cu_seqlens,
                             unpack_tensor, unpad_input)
from patches.ulysses import gather_outputs_and_unpad, pad_and_slice, pad_and_slice_inputs


def _batch():
    # row 0 left-padded by 2, row 1 right-padded by 1, row 2 both (1 left, 2 right), row 3 empty
    ids = torch.arange(1, 21).view(4, 5)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    return ids, mask


def test_unpad_input_left_right_and_empty_rows():
    ids, mask = _batch()
    packed, pos, indices, cu, max_len = unpad_input(ids, mask)
    assert packed.tolist() == [[3, 4, 5, 6, 7, 8, 9, 12, 13]]
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1]]
    assert indices.tolist() == [2, 3, 4, 5, 6, 7, 8, 11, 12]
    assert cu.tolist() == [0, 3, 7, 9, 9] and cu.dtype == torch.int32
    assert max_len == 4


def test_pack_unpack_roundtrip_and_grad():
    ids, mask = _batch()
    _, _, indices, _, _ = unpad_input(ids, mask)
    x = torch.randn(4, 5, 3, requires_grad=True)
    y = unpack_tensor(pack_tensor(x, indices), indices, 4, 5)
    torch.testing.assert_close(y, x * mask[..., None])
    y.sum().backward()
    torch.testing.assert_close(x.grad, mask[..., None].float().expand(4, 5, 3))
    with pytest.raises(ValueError, match="rows"):
        unpack_tensor(torch.zeros(3), indices, 4, 5)


def test_cu_seqlens_from_position_ids():
    cu, mx = cu_seqlens_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1, 0]]))
    assert cu.tolist() == [0, 3, 7, 9, 10] and mx == 4
    with pytest.raises(ValueError, match="start with 0"):
        cu_seqlens_from_position_ids(torch.tensor([3, 4, 0, 1]))
    assert position_ids_from_cu_seqlens(torch.tensor([0, 2, 2, 5])).tolist() == [0, 1, 0, 1, 2]


def test_p14_packed_loss_spans():
    spans, mask = pack_loss_spans([6, 5, 7], [(3, 5), (2, 4), (4, 6)])
    assert spans == [(3, 5), (8, 10), (15, 17)]  # the buggy "end of previous span" offset gives (7,9), (13,15)
    assert mask.sum().item() == 6.0
    assert mask.nonzero().flatten().tolist() == [3, 4, 8, 9, 15, 16]
    # the label of the last masked token of the last sample (index 16) exists: total length 18 > 17
    assert mask.numel() == 18
    with pytest.raises(ValueError, match="outside"):
        pack_loss_spans([6], [(4, 7)])
    with pytest.raises(ValueError, match="spans"):
        pack_loss_spans([6, 5], [(0, 1)])


def test_p14_a_multi_turn_sample_has_one_loss_span_per_assistant_turn():
    """A sample's entry may list several spans (it raised a bare TypeError)."""
    spans, mask = pack_loss_spans([5, 5], [[(1, 2), (3, 5)], (0, 1)])
    assert spans == [(1, 2), (3, 5), (5, 6)] and mask.nonzero().flatten().tolist() == [1, 3, 4, 5]
    with pytest.raises(ValueError, match=r"^spans of sample 0: \[\(1, 2\), 3\]; expected \(start, end\) or a list"):
        pack_loss_spans([5], [[(1, 2), 3]])
    with pytest.raises(ValueError, match=r"span \(3, 6\) of sample 1 is outside \[0, 5\]"):
        pack_loss_spans([5, 5], [(0, 1), [(0, 1), (3, 6)]])


def test_pad_and_slice_inputs_not_multiple_of_sp():
    ids = torch.arange(10, 17)[None]  # nnz = 7
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    chunks = [pad_and_slice_inputs(ids, pos, 4, r) for r in range(4)]
    assert all(c[2] == 1 for c in chunks)
    assert torch.cat([c[0] for c in chunks], 1).tolist() == [[10, 11, 12, 13, 14, 15, 16, 0]]
    # the pad token forms its own sequence starting at position 0
    assert torch.cat([c[1] for c in chunks], 1).tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert pad_and_slice_inputs(ids, pos, 1, 0)[2] == 0
    empty, pad = pad_and_slice(torch.zeros(1, 0, dtype=torch.long), 2, 1)
    assert pad == 2 and empty.shape == (1, 1)
    with pytest.raises(ValueError, match="sp_rank"):
        pad_and_slice_inputs(ids, pos, 2, 2)


def test_gather_outputs_and_unpad_without_sp_only_unpads():
    x = torch.arange(8.0, requires_grad=True)
    y = gather_outputs_and_unpad(x, 0, 3, None)
    assert y.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    y.sum().backward()
    assert x.grad.tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
