"""Keeps the top 16 bits without rounding: truncation toward zero, not round to nearest."""

LOSES = ["test_round_to_bfloat16_matches_torch_bit_for_bit"]


def round_to_bfloat16(x):
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("pass a float32 tensor")
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    top = torch.where(x.isnan(), 0x7FC0, bits >> 16)
    return torch.where(top >= 0x8000, top - 0x10000, top).to(torch.int16).view(torch.bfloat16)
