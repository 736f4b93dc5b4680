"""Lets torch do the rounding with x.to(torch.bfloat16): right bits, but the exercise is to compute them."""

LOSES = ["test_round_to_bfloat16_matches_torch_bit_for_bit", "test_round_to_bfloat16_keeps_any_shape_and_layout"]


def round_to_bfloat16(x):
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("pass a float32 tensor")
    return x.to(torch.bfloat16)
