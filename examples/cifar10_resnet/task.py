"""ResNet-50 on CIFAR-10 as a rayft custom task: the shape of a GPU-cluster image-classification run.

What it teaches: the same :class:`rayft.custom.CustomTask` as ``examples/digits_cnn`` at full
size. torchvision provides the model and the data (``pip install torchvision``); it is imported
only when the task builds them, so the config validates on a machine without it. Run it on a GPU
cluster with ``rayft train examples/cifar10_resnet/cifar10-resnet50.yaml`` (or ``rayft submit``).

Training images are augmented (random crop with 4-pixel padding, horizontal flip) with torch's
generator, which rayft seeds per worker and restores on resume, so a restarted run sees the same
augmentations. BatchNorm layers become SyncBatchNorm (``sync_batchnorm``, GPUs only): every worker
then normalises with the statistics of the whole step's batch and keeps the same running averages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the usual alias
from torch import nn

from rayft.custom import TaskData
from rayft.errors import MissingDependencyError

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _torchvision() -> Any:
    try:
        import torchvision
    except ImportError:
        raise MissingDependencyError(
            "the CIFAR-10 example needs torchvision: pip install torchvision (the build matching your torch)"
        ) from None
    return torchvision


class Augmented(Sequence[Any]):
    """A CIFAR-10 split as (normalised 3x32x32 tensor, label), randomly cropped and flipped if ``augment``."""

    def __init__(self, images: torch.Tensor, labels: list[int], *, augment: bool) -> None:
        self.images = ((images.float() / 255.0) - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
        self.labels = labels
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        image = self.images[index]
        if self.augment:
            top, left = torch.randint(0, 9, (2,)).tolist()
            image = F.pad(image, (4, 4, 4, 4))[:, top : top + 32, left : left + 32]
            if torch.rand(()) < 0.5:
                image = image.flip(-1)
        return image, self.labels[index]


@dataclass(frozen=True)
class Cifar10ResNet:
    """The rayft task: ``task.options`` are this class's fields."""

    data_dir: str = "data/cifar10"  # where torchvision finds (or downloads) CIFAR-10; the same on every node
    download: bool = False  # fetch CIFAR-10 into data_dir when it is missing (needs network on every node)
    sync_batchnorm: bool = True  # SyncBatchNorm across the DDP workers (GPU only)
    label_smoothing: float = 0.1

    def build_model(self) -> nn.Module:
        """torchvision's ResNet-50 with the CIFAR stem: a 3x3 first convolution, no max-pooling."""
        model = _torchvision().models.resnet50(num_classes=10)
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
        return nn.SyncBatchNorm.convert_sync_batchnorm(model) if self.sync_batchnorm else model

    def build_datasets(self, seed: int) -> TaskData:
        """The 50,000 training images (augmented) and the 10,000 test images (held out)."""
        datasets = _torchvision().datasets

        def split(train: bool) -> Augmented:
            raw = datasets.CIFAR10(self.data_dir, train=train, download=self.download)
            images = torch.from_numpy(raw.data).permute(0, 3, 1, 2)
            return Augmented(images, list(raw.targets), augment=train)

        return TaskData(train=split(True), validation=split(False))

    def collate(self, examples: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
        return {
            "images": torch.stack([image for image, _ in examples]),
            "labels": torch.tensor([label for _, label in examples], dtype=torch.long),
        }

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["images"]), batch["labels"], label_smoothing=self.label_smoothing)

    def metrics(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, float]:
        predicted = model(batch["images"]).argmax(dim=-1)
        return {"accuracy": float((predicted == batch["labels"]).float().mean())}
