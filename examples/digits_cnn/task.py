"""A small ResNet-style CNN on scikit-learn's handwritten digits, as a rayft custom task.

What it teaches: bringing your own model to rayft. The class below is all the model-specific code
(:class:`rayft.custom.CustomTask`: the model, the datasets, the batches, the loss, the metrics);
``rayft train examples/digits_cnn/digits.yaml`` runs it on 2 Ray Train workers with DDP, with
rayft's checkpoints, exact resume after a worker dies, metric sinks and learning-rate schedule.

The data is the 1,797 8x8 grey-scale digits that ship inside scikit-learn (offline, real
handwriting, UCI's optdigits test set); a seeded fifth of them is held out and scored every
``train.eval_steps`` (``eval/accuracy``). Needs ``pip install scikit-learn`` (``rayft[examples]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the usual alias
from torch import nn

from rayft.custom import TaskData


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions with a skip connection (a 1x1 projection when the shape changes).

    GroupNorm rather than BatchNorm: it keeps no running statistics, so every DDP worker holds
    the same model and a resumed run evaluates exactly as an uninterrupted one.
    """

    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(4, channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(4, channels_out)
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.skip = nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False),
                                      nn.GroupNorm(4, channels_out))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.skip(x))


class DigitsResNet(nn.Module):
    """Stem, one residual block at 8x8, one at 4x4 with twice the channels, pooling, classifier."""

    def __init__(self, width: int, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False), nn.GroupNorm(4, width), nn.ReLU())
        self.blocks = nn.Sequential(ResidualBlock(width, width, 1), ResidualBlock(width, 2 * width, 2))
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(images))
        return self.head(features.mean(dim=(2, 3)))


@dataclass(frozen=True)
class DigitsTask:
    """The rayft task: ``task.options`` are this class's fields."""

    width: int = 16  # channels of the first block (the second has twice as many)
    validation_fraction: float = 0.2  # share of the digits held out for eval/accuracy

    def __post_init__(self) -> None:
        if self.width <= 0 or self.width % 4:
            raise ValueError(f"width={self.width}: use a positive multiple of 4 (GroupNorm uses 4 groups)")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction={self.validation_fraction}: use a value between 0 and 1")

    def build_model(self) -> nn.Module:
        return DigitsResNet(self.width)

    def build_datasets(self, seed: int) -> TaskData:
        """(image 1x8x8 in [0, 1], label) pairs; a seeded permutation picks the held-out ones."""
        import numpy as np
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        labels = torch.tensor(digits.target, dtype=torch.long)
        order = np.random.default_rng(seed).permutation(len(labels))
        held_out = round(len(labels) * self.validation_fraction)
        pairs = [(images[i], int(labels[i])) for i in order.tolist()]
        return TaskData(train=pairs[held_out:], validation=pairs[:held_out])

    def collate(self, examples: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
        return {
            "images": torch.stack([image for image, _ in examples]),
            "labels": torch.tensor([label for _, label in examples], dtype=torch.long),
        }

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["images"]), batch["labels"])

    def metrics(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, float]:
        predicted = model(batch["images"]).argmax(dim=-1)
        return {"accuracy": float((predicted == batch["labels"]).float().mean())}
