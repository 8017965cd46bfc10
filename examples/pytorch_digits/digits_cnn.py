"""A plain PyTorch model and training loop, trained by Confide without changes to either.

Everything above ``federated_model`` is ordinary PyTorch, written the way a PyTorch user writes
it; ``federated_model`` hands the module and the loop to Confide's adapter. The job file
(``job.yaml`` beside this file) points at it with ``model.entry: digits_cnn.py:federated_model``.
"""

import torch
import torch.nn.functional as F
from torch import nn

from confide.ml.torch_adapter import TorchModel


class Net(nn.Module):
    """Two convolutions and a linear classifier for 8x8 grey images."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, kernel_size=3, padding=1)
        self.fc = nn.Linear(2 * width * 2 * 2, 10)

    def forward(self, x):
        """Logits of a batch of (n, 1, 8, 8) images."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def train(net, loader, epochs, lr=5e-3):
    """One optimizer, cross-entropy, the usual loop."""
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    total, count = 0.0, 0
    for _ in range(epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(images), labels)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(labels), count + len(labels)
    return {"loss": total / max(count, 1)}


def channels_first(images):
    """Confide's image datasets are (n, height, width, channels); PyTorch convolutions want channels first."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()


def federated_model(width: int = 16, batch_size: int = 32):
    """What ``model.entry`` names: the module and the loop, wrapped for Confide."""
    return TorchModel(Net(width), train, batch_size=batch_size, input_transform=channels_first)
