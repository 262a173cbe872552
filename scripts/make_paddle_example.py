"""Regenerate the shipped Paddle example: ``src/torchgraft/examples/lenet_bn.pdparams``.

A LeNet-5 with BatchNorm, built and saved by real PaddlePaddle (random weights and BatchNorm
statistics), so the demo can show a Paddle checkpoint on machines without paddle; beside it,
``lenet_bn_io.npz`` holds an input and the logits Paddle computed for it (eval mode), which
the demo compares with the grafted PyTorch model's.
Run: python scripts/make_paddle_example.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
from paddle import nn

EXAMPLES = Path(__file__).resolve().parents[1] / "src/torchgraft/examples"
OUT = EXAMPLES / "lenet_bn.pdparams"


class LeNetBN(nn.Layer):
    """The seeds' LeNet (3-channel 32x32 input, 10 classes), with BatchNorm after each conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2D(3, 6, 5)
        self.bn1 = nn.BatchNorm2D(6)
        self.conv2 = nn.Conv2D(6, 16, 5)
        self.bn2 = nn.BatchNorm2D(16)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """Classify a batch of 3x32x32 images."""
        pool = nn.functional.max_pool2d
        x = pool(nn.functional.relu(self.bn1(self.conv1(x))), 2)
        x = pool(nn.functional.relu(self.bn2(self.conv2(x))), 2)
        x = nn.functional.relu(self.fc1(x.flatten(1)))
        return self.fc3(nn.functional.relu(self.fc2(x)))


def main() -> None:
    """Build the model with random weights and statistics, and save it."""
    paddle.seed(0)
    model = LeNetBN()
    for bn in (model.bn1, model.bn2):
        bn._mean.set_value(paddle.rand(bn._mean.shape) * 0.5)
        bn._variance.set_value(paddle.rand(bn._variance.shape) + 0.5)
    paddle.save(model.state_dict(), str(OUT))
    model.eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    logits = model(paddle.to_tensor(x)).numpy()
    np.savez(EXAMPLES / "lenet_bn_io.npz", x=x, logits=logits)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes) and lenet_bn_io.npz")


if __name__ == "__main__":
    main()
