"""Layouts of other frameworks that only the target can reveal.

Most frameworks' files say what they are, and their readers (``torchgraft.io``) re-lay them as
PyTorch's. MLX's ``save_weights`` writes plain safetensors or npz with no marker, and stores
a convolution's weight channels last: ``[out, kh, kw, in]`` (``[out, k, in]`` in 1-D). Such a
file is recognised against the target: at least one stored convolution weight fits a target
convolution only once permuted. Then every convolution weight is permuted; a file whose
convolutions all read the same either way (``in == kh == kw``) cannot be told apart and is
taken as stored.
"""

from __future__ import annotations

from ..tensors import Side, TensorInfo
from .layout import Layout

__all__ = ["FRAMEWORK_LAYOUTS", "MLX_CONV"]

#: PyTorch's convolution weight from MLX's, by number of dimensions.
_MLX_TO_TORCH = {3: (0, 2, 1), 4: (0, 3, 1, 2), 5: (0, 4, 1, 2, 3)}


def _permuted_shape(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    dims = _MLX_TO_TORCH.get(len(shape))
    return tuple(shape[d] for d in dims) if dims else None


def _mlx_convs(src: Side, dst: Side) -> bool:
    """Some source weight fits a target convolution only in MLX's layout, none only as stored."""
    convs = {info.shape for info in dst.tensors.values()
             if info.kind == "conv" and info.name.endswith("weight")}
    if src.format not in ("safetensors", "numpy") or not convs:
        return False
    weights = [info.shape for name, info in src.tensors.items()
               if name.endswith("weight") and len(info.shape) in _MLX_TO_TORCH]
    as_mlx = [s for s in weights if _permuted_shape(s) in convs and s not in convs]
    as_stored = [s for s in weights if s in convs and _permuted_shape(s) not in convs]
    return bool(as_mlx) and not as_stored


def _mlx_dims(src: TensorInfo, dst: TensorInfo) -> tuple[int, ...] | None:
    if dst.kind != "conv" or len(src.shape) != len(dst.shape):
        return None
    return _MLX_TO_TORCH.get(len(src.shape))


MLX_CONV = Layout(
    name="mlx-conv",
    applies=_mlx_convs,
    permuted=_mlx_dims,
    why="MLX stores convolution weights channels last, [out, kh, kw, in]",
)

FRAMEWORK_LAYOUTS = (MLX_CONV,)
