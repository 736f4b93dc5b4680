"""Checks only the sizes its formula uses, so classes=0 (an impossible model) returns a number instead of ValueError."""

LOSES = ["test_mlp_activation_bytes_rejects_bad_sizes"]


def mlp_activation_bytes(batch_size, features, hidden, classes, depth, dtype=torch.float32):
    if min(batch_size, features, hidden, depth) < 1:
        raise ValueError("batch_size, features, hidden and depth must be at least 1")
    element = torch.empty((), dtype=dtype).element_size()
    return batch_size * (features + depth * hidden) * element
