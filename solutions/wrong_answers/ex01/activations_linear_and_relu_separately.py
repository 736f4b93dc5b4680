"""Counts the ReLU's output and the next Linear's input as two tensors, though they are the same one."""

LOSES = ["test_mlp_activation_bytes_matches_what_autograd_saves"]


def mlp_activation_bytes(batch_size, features, hidden, classes, depth, dtype=torch.float32):
    if min(batch_size, features, hidden, classes, depth) < 1:
        raise ValueError("every size must be at least 1")
    element = torch.empty((), dtype=dtype).element_size()
    return batch_size * (features + 2 * depth * hidden) * element
