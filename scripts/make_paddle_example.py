"""Regenerate the shipped Paddle example: ``src/torchgraft/examples/lenet_bn.pdparams``.

A LeNet-5 with BatchNorm, built and saved by real PaddlePaddle (random weights and BatchNorm
statistics), so the demo can show a Paddle checkpoint on machines without paddle.
Run: python scripts/make_paddle_example.py
"""

from __future__ import annotations

from pathlib import Path

import paddle
from paddle import nn

OUT = Path(__file__).resolve().parents[1] / "src/torchgraft/examples/lenet_bn.pdparams"


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


def main() -> None:
    """Build the model with random weights and statistics, and save it."""
    paddle.seed(0)
    model = LeNetBN()
    for bn in (model.bn1, model.bn2):
        bn._mean.set_value(paddle.rand(bn._mean.shape) * 0.5)
        bn._variance.set_value(paddle.rand(bn._variance.shape) + 0.5)
    paddle.save(model.state_dict(), str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
