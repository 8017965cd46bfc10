"""HFModel without transformers: what travels, what is hashed, and bfloat16 (a plain torch module stands in)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an extra (confide[hf]); make test installs it")

from confide.errors import InvalidParameterError  # noqa: E402
from confide.ml.hf_model import HFModel, base_digest  # noqa: E402


def adapted() -> torch.nn.Module:
    """A frozen 'base' layer and a trainable bfloat16 'adapter' layer."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.bfloat16))
    for p in net[0].parameters():
        p.requires_grad_(False)
    return net


def test_only_what_trains_travels_and_bfloat16_is_widened_and_restored():
    net = adapted()
    model = HFModel(net)
    weights = model.get_weights()
    assert list(weights) == ["1.weight", "1.bias"]
    assert weights["1.weight"].dtype == np.float32 and weights["1.weight"].shape == (2, 3)
    assert model.frozen_parameters == 4 * 3 + 3
    model.set_weights({name: value + 0.5 for name, value in weights.items()})
    assert net[1].weight.dtype == torch.bfloat16
    np.testing.assert_allclose(net[1].weight.detach().float().numpy(), weights["1.weight"] + 0.5, atol=1e-2)


def test_the_base_digest_covers_every_frozen_weight_and_nothing_that_trains():
    first = HFModel(adapted()).base_digest
    assert first == HFModel(adapted()).base_digest and len(first) == 64
    changed = adapted()
    with torch.no_grad():
        changed[1].weight += 1  # trains: not part of the base
    assert HFModel(changed).base_digest == first
    with torch.no_grad():
        changed[0].bias[0] += 1e-3
    assert HFModel(changed).base_digest != first
    bf16 = [("w", torch.ones(3, dtype=torch.bfloat16))]
    assert base_digest(bf16) != base_digest([("w", torch.ones(3, dtype=torch.float32))])


def test_a_model_with_nothing_to_train_is_refused():
    net = adapted()
    for p in net.parameters():
        p.requires_grad_(False)
    with pytest.raises(InvalidParameterError, match="no parameter of the model trains"):
        HFModel(net)
    with pytest.raises(InvalidParameterError, match="needs a torch.nn.Module"):
        HFModel(object())
