"""The parties' own PyTorch sub-networks for a Hetero NN job (job.yaml names them).

Each factory gets the number of input columns (and, for the top model, the number of outputs
it must end with) and returns a plain ``torch.nn.Module``. Confide drives it through the split
protocol: forward on a batch, backward from the gradient that arrives at the cut layer, Adam on
its parameters. Write them as you would any PyTorch module.
"""

import torch
from torch import nn


class ResidualBottom(nn.Module):
    """The lab's bottom model: a gated residual block over its 20 columns."""

    def __init__(self, input_dim: int, width: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(input_dim, width)
        self.gate = nn.Linear(input_dim, width)
        self.skip = nn.Linear(input_dim, width, bias=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Gated tanh features plus a linear skip, normalised."""
        return self.norm(torch.tanh(self.hidden(x)) * torch.sigmoid(self.gate(x)) + self.skip(x))


def lab_bottom(input_dim: int, width: int = 8) -> nn.Module:
    """The lab's bottom model (``bottom: {torch: nets.py:lab_bottom}``)."""
    return ResidualBottom(input_dim, width)


def hospital_top(input_dim: int, outputs: int) -> nn.Module:
    """The hospital's top model; it ends with ``outputs`` linear units (logits): the head applies the sigmoid."""
    return nn.Sequential(nn.Linear(input_dim, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, outputs))
