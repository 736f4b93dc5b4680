"""Rounds NaNs like numbers: a NaN with only low payload bits carries into inf."""

LOSES = ["test_round_to_bfloat16_matches_torch_bit_for_bit"]


def round_to_bfloat16(x):
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("pass a float32 tensor")
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return torch.where(rounded >= 0x8000, rounded - 0x10000, rounded).to(torch.int16).view(torch.bfloat16)
