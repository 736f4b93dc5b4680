"""Adds the rounding bias in place to x.view(torch.int32), a view: the caller's float32 tensor is changed."""

LOSES = ["test_round_to_bfloat16_matches_torch_bit_for_bit", "test_round_to_bfloat16_keeps_any_shape_and_layout"]


def round_to_bfloat16(x):
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("pass a float32 tensor")
    nan = x.isnan()
    bits = x.view(torch.int32)  # shares x's memory
    bits += 0x7FFF + ((bits >> 16) & 1)
    return torch.where(nan, 0x7FC0, bits >> 16).to(torch.int16).view(torch.bfloat16)
