"""Flattens x with .view(-1) and reshapes back: fails on a transposed or strided x, which needs reshape."""

LOSES = ["test_round_to_bfloat16_keeps_any_shape_and_layout"]

_round_to_bfloat16 = round_to_bfloat16


def round_to_bfloat16(x):
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("pass a float32 tensor")
    return _round_to_bfloat16(x.view(-1)).view(x.shape)
