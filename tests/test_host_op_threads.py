"""host_op_threads (patches.host, re-exported by trainer.forward): the host-side packing of a micro-batch runs on one intra-op thread (with a large
pool its tiny ops wait for the pool and the GPU idles; docs/benchmarks.md, "idle gaps"), the model's forward keeps the
caller's thread count, and the count is restored even when packing fails."""
import pytest
import torch

import patches.packed_forward as packed_forward
from tests.test_static_shapes import _batch, _model
from trainer.forward import forward_log_probs, forward_values, host_op_threads


@pytest.fixture
def two_threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(prev)


def test_host_op_threads_sets_and_restores_and_refuses_zero(two_threads):
    with host_op_threads():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), host_op_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="n >= 1, got 0"):
        with host_op_threads(0):
            pass


@pytest.mark.parametrize("value_head", [False, True], ids=["log_probs", "critic_values"])
def test_host_packing_is_single_threaded_and_the_forward_is_not(monkeypatch, two_threads, value_head):
    seen = {}
    real_unpad = packed_forward.unpad_input

    def unpad(*a, **k):
        seen["packing"] = torch.get_num_threads()
        return real_unpad(*a, **k)

    monkeypatch.setattr(packed_forward, "unpad_input", unpad)
    model = _model("qwen2", value_head)
    model.register_forward_pre_hook(lambda *_: seen.__setitem__("forward", torch.get_num_threads()))
    ids, mask, pos, R = _batch([(4, 4), (0, 3)], 4, 4, 0)
    run = forward_values if value_head else forward_log_probs
    out = run(model, ids, mask, pos, R, device="cpu")  # CPU inputs + a device: packed on the host
    assert seen == {"packing": 1, "forward": 2} and torch.get_num_threads() == 2
    want = run(model, ids, mask, pos, R)  # inputs' own device: no host packing, no thread change
    assert seen == {"packing": 2, "forward": 2}
    out, want = (o[0] if isinstance(o, tuple) else o for o in (out, want))
    torch.testing.assert_close(out * mask[:, -R:], want * mask[:, -R:])
