"""Takes any tensor: a float64 or bfloat16 tensor is reinterpreted, or fails with the wrong error."""

LOSES = ["test_round_to_bfloat16_rejects_other_dtypes"]


def round_to_bfloat16(x):
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = torch.where(x.isnan(), 0x7FC0, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
    return torch.where(rounded >= 0x8000, rounded - 0x10000, rounded).to(torch.int16).view(torch.bfloat16)
